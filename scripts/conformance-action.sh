#!/usr/bin/env bash
# The step of action.yml: install the harness at the action's own version (this checkout) into a
# virtual environment of its own, run it against INPUT_TARGET with --format github (one line per
# case, an ::error annotation per failing case, the job summary in $GITHUB_STEP_SUMMARY), leave
# the JUnit and JSON reports where the inputs say for the next step, and exit with the run's code.
set -uo pipefail
venv="${RUNNER_TEMP:-${TMPDIR:-/tmp}}/lmrpc-conformance"
if ! { "$INPUT_PYTHON" -m venv "$venv" &&
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$GITHUB_ACTION_PATH[conformance]"; }; then
  echo "::error title=lmrpc conformance::could not install the harness from $GITHUB_ACTION_PATH with $INPUT_PYTHON"
  echo "exit-code=3" >>"${GITHUB_OUTPUT:-/dev/null}"
  exit 3
fi
"$venv/bin/conformance" --version
command=(
  "$venv/bin/conformance" run --format github
  --target "$INPUT_TARGET" --protocol "$INPUT_PROTOCOL" --level "$INPUT_LEVEL"
  --wait "$INPUT_WAIT" --time-scale "$INPUT_TIME_SCALE"
  --junit "$INPUT_JUNIT" --json "$INPUT_JSON" --repro-dir "$INPUT_REPRO_DIR"
)
if [ -n "$INPUT_BASELINE" ]; then
  command+=(--baseline "$INPUT_BASELINE")
fi
# split as a shell would (quotes respected), but nothing in them is run or expanded
mapfile -d '' extra < <("$venv/bin/python" -c 'import shlex, sys; sys.stdout.write("\0".join(shlex.split(sys.argv[1])))' "$INPUT_ARGS")
status=0
"${command[@]}" "${extra[@]}" || status=$?
echo "exit-code=$status" >>"${GITHUB_OUTPUT:-/dev/null}"
exit "$status"
