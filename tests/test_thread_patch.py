"""patched_in_this_thread: a wrapper seen by its own thread only, whatever other threads' blocks overlap."""
import threading
import types

from jit_ahead.core.thread_patch import patched_in_this_thread


def _library():
    lib = types.ModuleType("fake_lib")

    def double(x):
        return 2 * x

    class Op:
        @classmethod
        def apply(cls, x):
            return (cls.__name__, x)

    lib.double, lib.Op = double, Op
    return lib


def _tag(label, log):
    def wrapper(original, *args, **kwargs):
        log.append((label, threading.current_thread().name, args))
        return original(*args, **kwargs)
    return wrapper


def test_overlapping_blocks_in_two_threads_that_end_in_either_order():
    lib = _library()
    original = lib.double
    log: list = []
    steps = {name: threading.Event() for name in ("a_in", "b_in", "a_out", "b_called")}
    results = {}

    def a():
        with patched_in_this_thread(lib, "double", _tag("a", log)):
            steps["a_in"].set()
            steps["b_in"].wait(10)
            results["a"] = lib.double(1)
        steps["a_out"].set()  # a ends first: b's wrapper must stay in place for b

    def b():
        steps["a_in"].wait(10)
        with patched_in_this_thread(lib, "double", _tag("b", log)):
            steps["b_in"].set()
            steps["a_out"].wait(10)
            results["b"] = lib.double(5)
            steps["b_called"].set()

    threads = [threading.Thread(target=a, name="A"), threading.Thread(target=b, name="B")]
    for t in threads:
        t.start()
    steps["b_in"].wait(10)
    assert lib.double(7) == 14  # the main thread, in no block: no wrapper
    for t in threads:
        t.join(10)
    assert results == {"a": 2, "b": 10}
    assert log == [("a", "A", (1,)), ("b", "B", (5,))]
    assert lib.double is original


def test_nested_blocks_in_one_thread_chain_innermost_first_and_classmethods_get_the_class():
    lib = _library()
    stored = vars(lib.Op)["apply"]
    log: list = []
    with patched_in_this_thread(lib.Op, "apply", _tag("outer", log)):
        with patched_in_this_thread(lib.Op, "apply", _tag("inner", log)):
            assert lib.Op.apply(3) == ("Op", 3)
        assert lib.Op.apply(4) == ("Op", 4)
    assert lib.Op.apply(5) == ("Op", 5)
    assert [(label, args[1:]) for label, _, args in log] == [("inner", (3,)), ("outer", (3,)), ("outer", (4,))]
    assert all(args[0] is lib.Op for _, _, args in log)
    assert vars(lib.Op)["apply"] is stored


def test_a_later_replacement_by_someone_else_is_left_in_place():
    lib = _library()
    log: list = []
    with patched_in_this_thread(lib, "double", _tag("a", log)):
        ours = lib.double

        def theirs(x):
            return ours(x) + 1

        lib.double = theirs
        assert lib.double(1) == 3
    assert lib.double is theirs and lib.double(1) == 3  # ours now passes calls straight through
    assert [label for label, _, _ in log] == ["a"]
