"""`sweeper plugins [--args]` stays readable piped and at 80 columns, whatever the names a
third-party distribution brings (a table with no-wrap columns once turned into a thousand
one-character-wide lines)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import inprocess
from conftest import make_dist

from sweeper.pluginhost import registry

DIST = "acme-research-models-with-a-rather-long-distribution-name"
NAMES = [f"residual_transformer_variant_{i:02d}_with_gated_attention_and_rotary" for i in range(12)]
ARGS = [
    "hidden_size_of_the_feed_forward_block_in_each_layer",
    "number_of_attention_heads_per_layer",
    "dropout_probability_applied_after_every_residual_connection",
]
FACTORY = '''
def {name}(*, input_shape, num_classes, {args}):
    """A model with long names."""
    raise NotImplementedError
'''


def listing(*args: str) -> subprocess.CompletedProcess:
    """The real CLI, piped (its output is not a terminal), at 80 columns."""
    proc = inprocess.invoke(["plugins", *args], {"COLUMNS": "80"})
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_listing_fits_80_columns_with_many_long_named_plugins(site: Path):
    typed = ", ".join(f"{a}: {t} = {d!r}" for a, t, d in zip(ARGS, ("int", "int", "float"), (4096, 16, 0.125)))
    source = "".join(FACTORY.format(name=n, args=typed) for n in NAMES)
    # the built-ins' lines, which grow with each built-in plugin: the bounds below are on the rest
    builtin_args, builtin_table = len(listing("--args").stdout.splitlines()), len(listing().stdout.splitlines())
    make_dist(
        site,
        DIST,
        "2024.10.1",
        {"sweeper.models": {n: f"acme_long_models:{n}" for n in NAMES}},
        {"acme_long_models.py": source},
    )
    registry.refresh()

    with_args = listing("--args").stdout.splitlines()
    table = listing().stdout.splitlines()
    for lines in (with_args, table):
        too_long = [line for line in lines if len(line) > 80]
        assert not too_long, too_long[:3]
        cells = [c.strip() for line in lines for c in line.strip("│┃|").split("│") if c.strip("━─┏┓┗┛┡┩└┘┳┻╇┼ ")]
        assert not [c for c in cells if len(c) == 1], "one-character column fragments"
    # --args: one header per plugin, one line per argument; every name whole
    text = "\n".join(with_args)
    for name in NAMES:
        # the header wraps at spaces: the name and the distribution stay whole
        assert re.search(rf"^model {name}\s+\({DIST} 2024\.10\.1, ", text, re.M), name
    assert text.count(f"  {ARGS[0]}: int = 4096") == len(NAMES) and text.count(f"  {ARGS[2]}: float = 0.125") == len(
        NAMES
    )
    assert "  hidden: int = 256" in text  # the built-ins are listed too
    assert len(with_args) - builtin_args <= 6 * len(NAMES)  # blocks of a few lines, not a thousand fragments
    # the table: a row (or two, where a long name folds) per plugin, no entry-point column at 80
    rows = [line for line in table if DIST[:10] in line]
    assert len(rows) >= len(NAMES) and len(table) - builtin_table <= 4 * len(NAMES)
    assert "entry point" not in table[1]
