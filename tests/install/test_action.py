"""The GitHub Action (action.yml) as a runner runs it: its step's script with the variables a
runner sets, against a server with one fault. The run fails with an annotation for the failing
case, appends a job summary naming it, leaves the reports where its inputs say and sets its
exit-code output."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import yaml
from zoo_process import start_zoo

from reference_server.testing import ServerProcess

from .dist import ROOT

ACTION = ROOT / "action.yml"
MUTANT = "contract-revision-wrong"  # fails SVC-3 and nothing else among the SVC cases


def step_environment(step: dict[str, object], inputs: dict[str, str]) -> dict[str, str]:
    """The step's ``env:`` with each ``${{ inputs.NAME }}`` replaced as the runner would."""
    env = step["env"]
    assert isinstance(env, dict)
    resolved = {}
    for key, value in env.items():
        found = re.fullmatch(r"\$\{\{ inputs\.([a-z-]+) \}\}", str(value))
        assert found, f"{key}: {value!r} is not one input"
        resolved[key] = inputs[found.group(1)]
    return resolved


def test_the_action_annotates_a_failing_case_and_writes_the_job_summary(
    fake_server: ServerProcess, tmp_path: Path
) -> None:
    action = yaml.safe_load(ACTION.read_text())
    assert action["runs"]["using"] == "composite"
    (step,) = action["runs"]["steps"]
    declared = action["inputs"]
    zoo, ports = start_zoo("tests.selftest.zoo", "--upstream", fake_server.target, "--only", MUTANT)
    try:
        inputs = {name: str(spec.get("default", "")) for name, spec in declared.items()}
        inputs |= {"target": f"127.0.0.1:{ports[MUTANT]}", "wait": "30", "args": "--run 'SVC-*' --jobs 2"}
        checkout = tmp_path / "action"  # what a runner fetches for `uses:`: the tracked files only
        tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True)
        for path in tracked.stdout.splitlines():
            if (ROOT / path).is_symlink() or (ROOT / path).is_file():
                (checkout / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / path, checkout / path, follow_symlinks=False)
        workspace, runner_temp = tmp_path / "workspace", tmp_path / "runner-temp"
        workspace.mkdir()
        runner_temp.mkdir()
        summary, outputs = tmp_path / "summary.md", tmp_path / "outputs"
        env = {
            "PATH": os.pathsep.join(
                p for p in os.environ["PATH"].split(os.pathsep) if not p.startswith(str(ROOT))
            ),
            "HOME": str(Path.home()),
            "GITHUB_ACTIONS": "true",
            "CI": "true",
            "GITHUB_ACTION_PATH": str(checkout),
            "GITHUB_STEP_SUMMARY": str(summary),
            "GITHUB_OUTPUT": str(outputs),
            "RUNNER_TEMP": str(runner_temp),
            **step_environment(step, inputs),
        }
        done = subprocess.run(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
            cwd=workspace,
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
    finally:
        zoo.terminate()
        zoo.wait()
    log = done.stdout + done.stderr
    assert done.returncode == 1, log[-4000:]
    errors = [line for line in done.stdout.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1 and errors[0].startswith("::error title=FAIL SVC-3 (MUST)::SVC-3: "), log[-4000:]
    assert any(re.match(r"PASS +SVC-1 ", line) for line in done.stdout.splitlines())
    assert "exit-code=1" in outputs.read_text().splitlines()
    text = summary.read_text()
    assert "<code>SVC-3</code>" in text and "| FAIL | 1 |" in text
    assert (workspace / inputs["junit"]).read_text().startswith("<?xml")
    assert '"SVC-3"' in (workspace / inputs["json"]).read_text()
