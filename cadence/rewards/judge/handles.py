"""What a test sees of the solution: its names looked up in the worker (`Names`), answers as
exact built-in values, and anything else as a `Handle` that can be called, indexed, iterated and
measured but refuses to compare, hash or be truthy. The third part of the judge's program
(judge/__init__.py), after codec.py and workers.py."""

import builtins

if False:  # what the program defines before this part (judge/__init__.py); for readers and linters
    from cadence.rewards.judge.codec import decode, encode
    from cadence.rewards.judge.workers import Abort, Worker


class NotPlain(TypeError):
    """A test used a value the solution returned that is not plain data as if it were."""


class SolutionRaised(RuntimeError):
    """The solution raised an exception that means control flow, not an error, where the test
    would see it (StopIteration ends a `map` silently): the test gets this failure instead."""


# Re-raised in the test's frame as what they are: everything the solution may raise that is an
# error (ValueError, KeyError, ...). Never these: inside map/filter/zip/starmap or an `async for`
# they end the iteration silently, so `all(map(f, cases))` would pass with nothing checked.
CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")


class Handle:
    """A value that stayed in the worker (not plain data)."""

    __slots__ = ("_worker", "_id")

    def __init__(self, worker: Worker, ident: int) -> None:
        self._worker, self._id = worker, ident

    def __call__(self, *args, **kwargs):
        return value_of(self._worker, ["call", self._id, [to_worker(a) for a in args],
                                       {k: to_worker(v) for k, v in kwargs.items()}])

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return value_of(self._worker, ["getattr", self._id, name])

    def __getitem__(self, key):
        return value_of(self._worker, ["getitem", self._id, to_worker(key)])

    def __iter__(self):
        return iter(value_of(self._worker, ["iter", self._id]))

    def __len__(self) -> int:
        n = value_of(self._worker, ["len", self._id])
        if type(n) is not int:
            raise NotPlain("len() of the solution's object is not an int")
        return n

    def __repr__(self) -> str:
        return "<an object of the solution (not plain data)>"

    def _refuse(self, *_):
        raise NotPlain("a test compared or tested an object of the solution that is not plain data "
                       "(int, float, str, list, dict, ...): only plain values are compared")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __bool__ = __contains__ = _refuse
    __hash__ = __index__ = __int__ = __float__ = __complex__ = _refuse


def to_worker(v) -> list:
    """A test's argument for the worker: plain data (above), or a Handle of its own."""
    def other(x):
        if type(x) is Handle:
            return ["h", x._id]
        raise NotPlain(f"cannot pass a {type(x).__name__} to the solution (plain data only)")
    return encode(v, other)


def from_worker(worker: Worker, e: list):
    """Exact built-in values from the worker's JSON (or Handles): nothing of its types survives."""
    return decode(e, lambda ident: Handle(worker, ident))


def value_of(worker: Worker, req: list, reply: list | None = None):
    """What the worker answered to `req` (asked now unless `reply` is given), as the test sees it."""
    reply = worker.ask(req) if reply is None else reply
    if reply[0] == "value":
        if req[0] == "iter":
            return [from_worker(worker, x) for x in reply[1]]
        return from_worker(worker, reply[1])
    if reply[0] == "raise":
        name = str(reply[1])
        cls = getattr(builtins, name, None)
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise Abort(f"the solution raised {name}")  # SystemExit, KeyboardInterrupt, GeneratorExit: a failure
        if name in CONTROL_FLOW:
            raise SolutionRaised(f"the solution raised {name}: {str(reply[2])[:300]}")
        raise cls(str(reply[2])[:300])
    raise Abort(f"an answer the judge does not know: {reply[0]!r}")


class Names(dict):
    """The test's namespace: its own names, then builtins, then the solution's (from the worker)."""

    def __init__(self, worker: Worker) -> None:
        super().__init__(__name__="__main__")
        self.worker = worker

    def __missing__(self, name: str):
        if name in builtins.__dict__:
            raise KeyError(name)  # then Python looks in builtins: the judge's, never the solution's
        reply = self.worker.ask(["name", name])
        if reply[0] == "missing":
            raise KeyError(name)
        value = value_of(self.worker, ["name", name], reply)
        self[name] = value
        return value
