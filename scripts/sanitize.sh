#!/usr/bin/env bash
# Build gdscp's engine under sanitizers and run the host-path tests with it.
#
#   scripts/sanitize.sh [REPO] [MODE...]
#
# REPO defaults to the repository holding this script; MODE is "address"
# (AddressSanitizer + UndefinedBehaviorSanitizer) and/or "thread"
# (ThreadSanitizer), both by default. Each mode gets its own virtual
# environment and build folder under ${GDSCP_SANITIZE_ROOT:-/tmp} and they are
# reused on later runs, so only the first run pays for the installs. Two modes
# run side by side, each spreading its tests over two processes (pytest-xdist),
# their output printed one after the other as each ends.
#
# The Python interpreter is not instrumented, so the sanitizer runtime (GCC's,
# matching the compiler that builds the engine) is preloaded. ThreadSanitizer
# therefore sees only the engine and its bindings; its one suppression
# (scripts/tsan-suppressions.txt) is of glibc's own bookkeeping.
# Any sanitizer report (in the log files, which subprocesses of the tests
# write too, or in the output), a failing test or a crash makes the script
# exit non-zero.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${1:-$here/..}" && pwd)"
shift || true
modes=("$@")
[ ${#modes[@]} -gt 0 ] || modes=(address thread)

root="${GDSCP_SANITIZE_ROOT:-/tmp}"
python="${PYTHON:-python3}"
wanted=(tests/test_cufile.py tests/test_concurrency.py tests/test_reliability.py tests/test_mapped_reads.py tests/test_plan.py
        tests/test_kvikio_api.py
        tests/test_cufile_standin.py tests/test_bulk.py tests/test_multi_gpu.py)
# `gdscp copy` under signals is a test of the command line, not of the engine,
# and costs the most under the sanitizers: left out (-k below).
skip="not test_copy and not test_tree_copy_interrupted"
tests=()
for t in "${wanted[@]}"; do
  if [ -e "$repo/$t" ]; then tests+=("$repo/$t"); else echo "sanitize.sh: $t not found; skipped" >&2; fi
done
[ ${#tests[@]} -gt 0 ] || { echo "sanitize.sh: no test files in $repo" >&2; exit 2; }
deps=(numpy pytest pytest-xdist hypothesis typer rich scikit-build-core nanobind
      'nvidia-cuda-runtime>=13.0,<14' 'nvidia-cufile>=1.15' cmake ninja)

for mode in "${modes[@]}"; do
  case "$mode" in
    address|thread) ;;
    *) echo "sanitize.sh: unknown mode '$mode' (use address or thread)" >&2; exit 2 ;;
  esac
done

# One mode, start to end; its status says whether it found anything.
run_mode() {
  local mode=$1 short runtime status=0
  case "$mode" in
    address) short=asan; runtime="$(gcc -print-file-name=libasan.so)" ;;
    thread)  short=tsan; runtime="$(gcc -print-file-name=libtsan.so)" ;;
  esac
  if [ ! -e "$runtime" ] || [ "$runtime" = "${runtime##*/}" ]; then
    echo "sanitize.sh: the $mode sanitizer runtime is not installed (gcc -print-file-name gave '$runtime')" >&2
    exit 2
  fi
  venv="$root/gdscp-$short"
  build="$root/gdscp-build-$short"
  logs="$root/gdscp-$short-logs"
  start=$SECONDS

  echo "== $mode: environment $venv"
  [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "${deps[@]}"

  echo "== $mode: building the engine in $build"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-build-isolation --force-reinstall --no-deps \
    -C "cmake.define.GDSCP_SANITIZE=$mode" -C cmake.build-type=RelWithDebInfo -C "build-dir=$build" "$repo"
  built=$SECONDS

  rm -rf "$logs"
  mkdir -p "$logs"
  # Run from outside the repository so that `import gdscp` finds the installed,
  # instrumented package rather than the source tree's.
  cd "$root"
  # libstdc++ too: the runtime resolves the real __cxa_throw when it starts, and
  # the interpreter does not link libstdc++, so without it the first C++
  # exception dies in the interceptor.
  libstdcxx="$(gcc -print-file-name=libstdc++.so)"
  # GDSCP_TESTS_BESIDE_OTHERS: the two runs share the machine (tests/conftest.py).
  env_run=(env "LD_PRELOAD=$runtime $libstdcxx" PYTHONFAULTHANDLER=1 GDSCP_TESTS_BESIDE_OTHERS=1)
  if [ "$mode" = address ]; then
    # Python's own allocations look like leaks to LeakSanitizer, so leaks are off.
    env_run+=("ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:log_path=$logs/asan:strict_string_checks=1:detect_stack_use_after_return=1"
              "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:abort_on_error=1:log_path=$logs/ubsan")
    launch=()
  else
    env_run+=("TSAN_OPTIONS=log_path=$logs/tsan:second_deadlock_stack=1:history_size=4:suppressions=$here/tsan-suppressions.txt")
    # Older TSan runtimes cannot map their shadow memory under the large address
    # randomisation of recent kernels; running without randomisation avoids it.
    launch=()
    if command -v setarch >/dev/null; then launch=(setarch "$(uname -m)" -R); fi
  fi
  echo "== $mode: tests"
  set +e
  "${env_run[@]}" "${launch[@]}" "$venv/bin/python" -c "import gdscp, sys; sys.exit(0 if '$venv' in gdscp.__file__ else 3)"
  rc_import=$?
  out="$root/gdscp-$short-pytest.out"
  "${env_run[@]}" "${launch[@]}" "$venv/bin/python" -m pytest -q -n 2 -p no:cacheprovider --capture=sys --rootdir "$repo" \
    -c "$repo/pyproject.toml" --basetemp "$root/gdscp-$short-tmp" -m "not gpu and not slow" -k "$skip" "${tests[@]}" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  set -e
  cd - >/dev/null

  reports=$(find "$logs" -type f | sort)
  if [ -n "$reports" ]; then
    echo "== $mode: sanitizer reports:" >&2
    for f in $reports; do echo "--- $f" >&2; cat "$f" >&2; done
    status=1
  fi
  # Some reports reach the output rather than the log files: UBSan's (GCC's
  # libubsan ignores log_path next to ASan; --capture=sys above lets its
  # writes to descriptor 2 through), and a child's that a failing test printed.
  if grep -qE "runtime error:|ERROR: AddressSanitizer|WARNING: ThreadSanitizer" "$out"; then
    echo "== $mode: sanitizer reports in the test output ($out):" >&2
    grep -nE -A3 "runtime error:|ERROR: AddressSanitizer|WARNING: ThreadSanitizer" "$out" | head -100 >&2
    status=1
  fi
  if [ $rc_import -ne 0 ]; then
    echo "== $mode: the instrumented gdscp is not the one imported" >&2
    status=1
  fi
  if [ $rc -ne 0 ]; then
    echo "== $mode: pytest exited with $rc" >&2
    status=1
  fi
  echo "== $mode: build $((built - start)) s, tests $((SECONDS - built)) s"
  return $status
}

if [ ${#modes[@]} -eq 1 ]; then
  run_mode "${modes[0]}"
  exit $?
fi
pids=()
for mode in "${modes[@]}"; do
  ( run_mode "$mode" ) > "$root/gdscp-sanitize-$mode.log" 2>&1 &
  pids+=($!)
done
status=0
for i in "${!modes[@]}"; do
  wait "${pids[$i]}" || status=1
  cat "$root/gdscp-sanitize-${modes[$i]}.log"
done
exit $status
