"""The unit-test judge: a program that runs inside the sandbox as one `judge=True` call (at the
sandbox agent's uid where user code has one of its own); never runs model code itself.

Sent as source (`JUDGE`) by cadence/rewards/unit_tests.py with `PARAMS` (JSON: the tests, the
solution, the per-test timeout and the call's nonce) defined in front of it. Standard library
only. The program is this package's files in order, one part each (none is a module to import
but codec.py): codec.py (plain data as tagged JSON), workers.py (the judge's side of the user's
processes), handles.py (what a test sees of the solution), main.py (run the tests, print the
verdict); the user's processes run `ZYGOTE`, codec.py then zygote.py.

The solution runs in *workers*, as user code (the uid in $CADENCE_SANDBOX_CODE_ID: it can neither
signal, ptrace nor read the /proc of this process). One *zygote* per call, a fresh interpreter
(exec'd, so it holds none of this process's memory: no tests, no nonce), forks a worker per test
(a fresh process per test, without an interpreter start-up per test). A worker runs the solution
and then only answers questions: "what is the name `add`", "call handle 3 with (2, 3)",
"attribute `push` of handle 5", "the items of handle 7". The test itself runs here, in the judge,
with every name it does not define itself (and that is not a builtin) looked up in the worker.
Answers cross as plain data of exact built-in types (None, bool, int, float, complex, str, bytes,
list, tuple, dict, set, frozenset); anything else stays in the worker behind a `Handle`, which
can be called, indexed, iterated, measured (len) and asked for attributes, but refuses to
compare, hash or be truthy. So:

* comparisons (`==`, `<`, `in`, truthiness) are always between built-in values, with built-in
  semantics: an object whose `__eq__` says yes to everything stays a Handle and fails the test;
* the expected values never enter the worker, which sees only the arguments of its calls;
* the worker can lie only about what the solution computed, which is what a solution does;
  exiting, raising SystemExit or KeyboardInterrupt, patching builtins, unittest or pytest,
  printing, or killing its zygote all happen on the user's side and fail a test at most;
* a test that runs out of time (the solution did not answer, or the test did not end, within
  test_timeout_s) is counted: the host then scores the whole solution 0, as a judge's "time
  limit exceeded" (time spent must never buy a partial result);
* the verdict is printed by this process only, on its own stdout (workers' output goes to
  /dev/null and they hold no fd of ours), as `<nonce> <passed> <timed out>`: the host trusts
  that line only, with the nonce it made for this call, and only when the call exited 0 within
  its limits.
"""

from pathlib import Path

_HERE = Path(__file__).parent


def _part(name: str) -> str:
    return (_HERE / name).read_text()


ZYGOTE = _part("codec.py") + _part("zygote.py")  # the user's processes' program (python -I -S -c)
JUDGE = f"ZYGOTE = {ZYGOTE!r}\n" + "".join(_part(name) for name in ("codec.py", "workers.py", "handles.py", "main.py"))
