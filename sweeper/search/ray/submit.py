"""`sweeper submit`: run a sweep as a Ray job on a cluster's head node.

The job's driver is `sweeper run` on the head; it joins the cluster through the RAY_ADDRESS
that Ray Jobs sets, so the spec needs no address. The resolved spec travels as the job's
working directory; the sweep runs in its output folder on the head node, so relative paths in
the spec (data roots) are relative to that folder. The head node needs sweeper (and the
plugins) installed.
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from sweeper.errors import UserError


@dataclass(frozen=True)
class Submitted:
    job_id: str
    out: str  # the sweep's output folder, on the head node
    follow: str  # the command that streams the job's log


def submit(spec_path: Path, overrides: list[str], address: str, out: str | None, python: str) -> Submitted:
    from sweeper.spec import load

    sweep = load(spec_path, overrides)
    if sweep.search.backend != "ray":
        raise UserError(
            f"{spec_path}: search.backend is '{sweep.search.backend}'; `sweeper submit` runs the "
            f"sweep as a Ray job, which expects search.backend: ray (add the override "
            f"search.backend=ray)"
        )
    if not address.startswith(("http://", "https://")):
        raise UserError(
            f"--address {address!r}: expected the Ray dashboard's URL, e.g. http://HEAD:8265 "
            f"(the Jobs API; not the GCS address HEAD:6379)"
        )
    from ray.job_submission import JobSubmissionClient

    from sweeper.search.ray.cluster import use_auth_token

    out = out or f"/tmp/sweeper/runs/{sweep.name}"  # absolute: the job's working dir is temporary
    # The entrypoint runs with the raylet's PATH: name the interpreter that has sweeper installed.
    # It runs the sweep from the output folder: Ray may delete the job's working directory while
    # the job runs (seen with Ray 2.60 at the end of Tuner.fit), so the spec is copied out first.
    q = shlex.quote(out)
    entrypoint = (
        f"mkdir -p {q} && cp spec.yaml {q}/submitted-spec.yaml && cd {q} && "
        f"{shlex.quote(python)} -m sweeper run submitted-spec.yaml --quiet --out {q}"
    )
    env = {k: os.environ[k] for k in ("MLFLOW_TRACKING_URI",) if k in os.environ}
    use_auth_token()
    try:
        with tempfile.TemporaryDirectory(prefix="sweeper-job-") as folder:  # uploaded by submit_job
            (Path(folder) / "spec.yaml").write_text(yaml.safe_dump(sweep.model_dump(mode="json"), sort_keys=False))
            client = JobSubmissionClient(address)
            job_id = client.submit_job(entrypoint=entrypoint, runtime_env={"working_dir": folder, "env_vars": env})
    except (ConnectionError, RuntimeError) as exc:
        raise UserError(
            f"--address {address}: cannot submit the job ({str(exc).splitlines()[0][:300]}); "
            f"expected a running Ray cluster's dashboard at that URL"
        ) from None
    return Submitted(job_id, out, f"ray job logs --follow --address {address} {job_id}")
