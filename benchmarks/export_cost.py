"""What exporting the best model costs: each format's export and its check, ResNet-18 on the CPU.

    python benchmarks/export_cost.py                 # ResNet-18 width 64 (11.2 M params), 3x32x32 input
    python benchmarks/export_cost.py --width 16 --val 128 --quantize

The model is untrained (the cost does not depend on the weights); the data is ``synthetic`` in
CIFAR-10's shape. "check" is the whole verification: a fresh Python process that imports the
format's runtime, loads the file, runs batches of 1 and 33 and the validation rows, and the
comparison with the eager model. The eager reference (computed once for all formats) is
printed separately.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=64, help="ResNet-18 base width (64: the standard one)")
    parser.add_argument("--val", type=int, default=256, help="validation rows run through each file")
    parser.add_argument("--quantize", action="store_true", help="also the ONNX int8 file")
    args = parser.parse_args()

    import torch

    from sweeper.export import EXAMPLE_ROWS, export_model, verify
    from sweeper.export.inputs import Cases, Signature
    from sweeper.spec import ExportSpec
    from sweeper_plugins.datasets import synthetic
    from sweeper_plugins.models import resnet18

    torch.manual_seed(0)
    data = synthetic(num_train=2, num_val=args.val, input_shape=(3, 32, 32), num_classes=10)
    model = resnet18(input_shape=(3, 32, 32), num_classes=10, width=args.width).eval()
    params = sum(p.numel() for p in model.parameters())
    print(
        f"resnet18 width {args.width}: {params / 1e6:.1f} M params, {args.val} validation rows, "
        f"{torch.get_num_threads()} torch threads, torch {torch.__version__}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        cases = Cases.of(data, Signature.of(data), EXAMPLE_ROWS)
        verify.Reference.compute(model, cases, data.val_y, Path(tmp))
        print(f"eager reference (batches 1, 33 and validation): {time.perf_counter() - started:.2f} s")
        started = time.perf_counter()
        report = export_model(model, data, Path(tmp) / "out", ExportSpec(quantize=args.quantize))
        total = time.perf_counter() - started
    print(f"{'format':<12} {'export s':>9} {'check s':>8} {'reload s':>9} {'MiB':>7} {'max |diff|':>11}")
    for e in report["formats"]:
        if "error" in e:
            print(f"{e['format']:<12} failed: {e['error']}")
            continue
        print(
            f"{e['format']:<12} {e['export_s']:>9.2f} {e['check_s']:>8.2f} {e['reload_s']:>9.2f} "
            f"{e['bytes'] / 2**20:>7.1f} {e['max_abs_diff']:>11.2g}"
        )
    print(f"total (reference + every export and check): {total:.1f} s")


if __name__ == "__main__":
    main()
