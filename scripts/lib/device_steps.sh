# Sourced by the device-host scripts (scripts/cuda_device_check.sh, scripts/device_cpu_check.sh):
# timed steps that log to one directory and a summary, and the end that archives it.
#   steps_begin OUT_DIR      create OUT_DIR, start $out/summary.txt; sets $out (absolute)
#   step NAME TIMEOUT_S CMD  run CMD, its output to $out/NAME.log; a failure or timeout is
#                            recorded and returned, and the script goes on
#   steps_end                the summary line, $out.tgz (for hosts that hand back few files),
#                            and an exit status that is non-zero if any step failed
# The callers run under `set -uo pipefail` without -e: a failed step must not end the run.

steps_begin() {
  mkdir -p "$1"
  out=$(cd "$1" && pwd)
  failed=()
  : >"$out/summary.txt"
}

step() {
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc after $((SECONDS - t0)) s" | tee -a "$out/summary.txt"
  [[ $rc -eq 0 ]] || failed+=("$name")
  return $rc
}

steps_end() {
  echo "total $SECONDS s; failed: ${failed[*]:-none}" | tee -a "$out/summary.txt"
  tar czf "$out.tgz" -C "$(dirname "$out")" "$(basename "$out")"
  [[ ${#failed[@]} -eq 0 ]]
}
