"""What the tests read from /proc about a server's processes and threads: its Python stubs, and the
CPU time and context switches of its threads (how a test sees a thread poll or sleep)."""
from pathlib import Path


def voluntary_switches(pid: int, thread: str) -> int | None:
    """Voluntary context switches of `pid`'s threads named `thread` (their comm), summed; None when
    it has no such thread. A thread that sleeps and is woken counts one each time."""
    total = None
    for task in Path(f"/proc/{pid}/task").iterdir():
        if _comm(task) != thread:
            continue
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    total = (total or 0) + int(line.split()[1])
        except OSError:  # a thread that ended meanwhile
            continue
    return total


def processes():
    """Every process as (pid, its arguments), those that end while read left out."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = [a.decode(errors="replace") for a in (d / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if args:
            yield int(d.name), args


def stubs_of(node_pid: int) -> list[int]:
    """Processes running mesh_stub.py from this node's runtime directory (its Python stubs)."""
    mark = f"/mesh-node-{node_pid}-"
    return [pid for pid, args in processes() if any(a.endswith("mesh_stub.py") and mark in a for a in args)]


def cpu_ticks(pid: int, thread: str | None = None) -> int | None:
    """User and system CPU time of `pid`, or of its threads named `thread` (their comm), summed, in
    clock ticks (1/100 s): what a thread that polls instead of sleeping burns shows here. None when
    there is no such process or thread."""
    paths = [Path(f"/proc/{pid}/stat")] if thread is None else [
        task / "stat" for task in Path(f"/proc/{pid}/task").iterdir() if _comm(task) == thread]
    total = None
    for path in paths:
        try:
            fields = path.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):  # ended meanwhile
            continue
        total = (total or 0) + int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15 of stat)
    return total


def _comm(task: Path) -> str | None:
    try:
        return (task / "comm").read_text().strip()
    except OSError:
        return None
