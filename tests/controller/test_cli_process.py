"""``mpigate controller`` as a process: kubeconfig credentials reach kopf and the controller's own
calls, the Lease is taken, SIGTERM stops it cleanly and releases the Lease."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import kmock as kmock_lib
import yaml
from tests.conftest import REPO
from tests.controller.conftest import example_job
from tests.controller.kube import NP, TJ, alive, declare, wait_for

from mpigate.audit import generate_key

LEASE = ("coordination.k8s.io/v1/leases", "mpigate-system", "mpigate-controller")


async def test_runs_from_a_kubeconfig_and_stops_on_sigterm(
    kmock: kmock_lib.KubernetesEmulator, tmp_path: Path
) -> None:
    declare(kmock)
    job = example_job("minimal", uid="uid-proc")
    kmock.objects[TJ, "nlp-team", "minimal"] = job
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "fake",
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "ctl"}}],
                "clusters": [{"name": "fake", "cluster": {"server": str(kmock.url).rstrip("/")}}],
                "users": [{"name": "ctl", "user": {"token": "s3cr3t-token"}}],
            }
        )
    )
    key = tmp_path / "audit.key"
    key.write_bytes(generate_key("ed25519")[0])  # the example org signs with ed25519
    env = {**os.environ, "POD_NAME": "ctl-pod", "POD_NAMESPACE": "mpigate-system"}
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "mpigate",
        "controller",
        "--config",
        str(REPO),
        "--kubeconfig",
        str(kubeconfig),
        "--audit-dir",
        str(tmp_path / "audit"),
        "--audit-key",
        str(key),
        "--metrics-port",
        "0",
        "--log-format",
        "text",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        # 300 s: only a failing test waits it out; under a load of 20 on two cores the controller's
        # start (a new Python importing kopf and mpigate) took longer than 30 s.
        await wait_for(
            lambda: alive(kmock, NP, "nlp-team", "mpigate-trainjob.minimal"), timeout=300, what="policy"
        )
        holder = alive(kmock, *LEASE)["spec"]["holderIdentity"]
        assert holder.startswith("ctl-pod-")
        auth = {
            r.headers.get("Authorization") for r in kmock["/apis/trainer.kubeflow.org/v1alpha1/trainjobs"]
        }
        auth |= {
            r.headers.get("Authorization")
            for r in kmock["post", "/apis/networking.k8s.io/v1/namespaces/nlp-team/networkpolicies"]
        }
        assert auth == {"Bearer s3cr3t-token"}  # kopf's watch and the controller's create
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = await asyncio.wait_for(process.communicate(), 120)
        # a rolling update waits on it: kopf's 5 s for tasks left in its loop made it 5 s and more
        stopped_in = time.monotonic() - signalled
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, output.decode()[-3000:]
    assert stopped_in < 3, f"SIGTERM took {stopped_in:.1f} s to end the process"
    assert alive(kmock, *LEASE)["spec"].get("holderIdentity") is None  # released for the standby
    assert b"released lease mpigate-system/mpigate-controller" in output
