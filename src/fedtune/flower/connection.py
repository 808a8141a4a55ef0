"""Talking to a running SuperLink: ``flwr``'s configuration, submitting runs, watching them.

``FlowerConnection`` is a ``FLWR_HOME`` whose ``config.toml`` names one SuperLink; ``flwr run``
(submit), ``flwr supernode register`` and ``flwr log`` use it, and run statuses are read through
the SuperLink's Control API. ``wait_for_run`` polls a submitted run until it finishes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedtune.flower.processes import DeploymentError, executable, flower_env

CONNECTION = "fedtune"
FINISHED = "finished"
ASK_ATTEMPTS = 3
ASK_BACKOFF_S = 0.5


@dataclass
class FlowerConnection:
    """A ``FLWR_HOME`` whose ``config.toml`` points ``flwr`` at one SuperLink."""

    home: Path
    address: str
    root_certificates: Path | None = None
    _client: Any = None

    def __post_init__(self) -> None:
        # flwr requires an absolute path to the CA certificate.
        if self.root_certificates is not None:
            self.root_certificates = self.root_certificates.expanduser().resolve()

    def write(self) -> FlowerConnection:
        self.home.mkdir(parents=True, exist_ok=True)
        lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]"]
        lines.append(f"address = {json.dumps(self.address)}")
        if self.root_certificates is None:
            lines.append("insecure = true")
        else:
            lines.append(f"root-certificates = {json.dumps(str(self.root_certificates))}")
        (self.home / "config.toml").write_text("\n".join(lines) + "\n")
        return self

    def flwr(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [executable("flwr"), *args],
            env=flower_env(self.home),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def register(self, public_key: Path) -> None:
        done = self.flwr("supernode", "register", str(public_key), CONNECTION, "--format", "json")
        if done.returncode != 0:
            raise DeploymentError(f"flwr supernode register {public_key} failed:\n{done.stdout}{done.stderr}")

    def submit(self, app_dir: Path) -> int:
        done = self.flwr("run", str(app_dir), CONNECTION, "--format", "json")
        try:
            answer = json.loads(done.stdout[done.stdout.index("{") :])
            return int(answer["run-id"])
        except (ValueError, KeyError, TypeError):
            raise DeploymentError(f"flwr run failed:\n{done.stdout}{done.stderr}") from None

    def status(self, run_id: int) -> tuple[str, str, str]:
        """``(status, sub_status, details)`` of a run, e.g. ``("finished", "completed", "")``."""
        from flwr.common.serde import run_from_proto
        from flwr.proto.control_pb2 import ListRunsRequest

        response = self._ask(lambda control: control.ListRuns(ListRunsRequest(run_id=run_id)))
        run = run_from_proto(response.run_dict[run_id])
        return run.status.status, run.status.sub_status, run.status.details

    def _ask(self, call: Callable[[Any], Any], attempts: int = ASK_ATTEMPTS) -> Any:
        """``call(control client)``, asked again on a fresh connection where the transport fails (the
        SuperLink may close a kept-alive connection just as it is reused: "Server disconnected without
        sending a response"); after ``attempts`` failures a DeploymentError naming the address."""
        import httpx

        for attempt in range(1, attempts + 1):
            try:
                return call(self._control())
            except httpx.TransportError as error:
                self.close()
                if attempt == attempts:
                    message = f"the SuperLink at {self.address} did not answer ({attempts} tries): {error}"
                    raise DeploymentError(message) from error
                time.sleep(ASK_BACKOFF_S * attempt)
        raise AssertionError("unreachable")

    def _control(self) -> Any:
        """The Control API client, made once (flwr's CLI helper prints a line; keep it quiet)."""
        if self._client is None:
            from flwr.cli.typing import SuperLinkConnection
            from flwr.cli.utils import init_http_client_from_connection

            os.environ["FLWR_HOME"] = str(self.home)
            connection = SuperLinkConnection(
                name=CONNECTION,
                address=self.address,
                root_certificates=None if self.root_certificates is None else str(self.root_certificates),
                insecure=self.root_certificates is None,
            )
            with contextlib.redirect_stdout(io.StringIO()):
                self._client = init_http_client_from_connection(connection)
        return self._client

    def online_nodes(self) -> int:
        """How many SuperNodes the SuperLink counts as online now."""
        from flwr.proto.control_pb2 import ListNodesRequest

        response = self._ask(lambda control: control.ListNodes(ListNodesRequest()))
        return sum(1 for node in response.nodes_info if node.status == "online")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def logs(self, run_id: int) -> str:
        done = self.flwr("log", str(run_id), CONNECTION, "--show")
        return done.stdout + done.stderr


def wait_for_run(
    connection: FlowerConnection,
    run_id: int,
    poll: float = 1.0,
    alive: Callable[[], None] | None = None,
    watch: Callable[[str], None] | None = None,
) -> None:
    """Poll until the run finishes; ``watch`` sees the run's status at every poll (e.g. to say what the
    run waits for); raise DeploymentError if it ended other than completed."""
    while True:
        if alive is not None:
            alive()
        status, sub_status, details = connection.status(run_id)
        if watch is not None:
            watch(status)
        if status == FINISHED:
            if sub_status != "completed":
                tail = "\n".join(connection.logs(run_id).splitlines()[-40:])
                raise DeploymentError(f"Flower run {run_id} {sub_status}: {details}\n{tail}")
            return
        time.sleep(poll)
