"""Which process holds which place of the server (its slots), and what each slot holds at
the end against its figures after the warm-up: resident memory grown by less than a
tolerance, file descriptors and threads not grown, no zombie. A worker killed and replaced
keeps its slot (the replacement is held to the killed one's figures); one killed and never
replaced is `lost` and only reported."""
from dataclasses import asdict, dataclass, field

from parashift.bench.soak.processes import ProcessSample, worker_pids


@dataclass
class Slot:
    name: str
    pids: list[int]               # the first, then each replacement
    lost: bool = False

    @property
    def pid(self) -> int:
        return self.pids[-1]


class Slots:
    """The server's processes by place: front, forkserver, resource_tracker, worker0...
    (workers in the order they started, i.e. rank order), other children by program."""

    def __init__(self, tree: dict[int, ProcessSample]):
        self.slots: dict[str, Slot] = {}
        workers = worker_pids(tree)
        for index, pid in enumerate(workers):
            self.slots[f"worker{index}"] = Slot(f"worker{index}", [pid])
        for sample in sorted(tree.values(), key=lambda s: s.start_ticks):
            if sample.pid in workers or sample.state == "Z":
                continue
            name, count = sample.role, 1
            while name in self.slots:
                count += 1
                name = f"{sample.role}{count}"
            self.slots[name] = Slot(name, [sample.pid])

    def follow(self, tree: dict[int, ProcessSample]) -> list[str]:
        """Gives a worker slot whose process is gone the newest worker nobody holds (its
        replacement), else marks it lost. Returns what changed, for the log."""
        held = {slot.pid for slot in self.slots.values()}
        newcomers = [pid for pid in worker_pids(tree) if pid not in held]
        changes = []
        for slot in self.slots.values():
            gone = slot.pid not in tree or tree[slot.pid].state == "Z"
            if not gone or (slot.lost and not newcomers):
                continue
            if slot.name.startswith("worker") and newcomers:
                slot.pids.append(newcomers.pop(0))
                slot.lost = False
                changes.append(f"{slot.name}: pid {slot.pids[-2]} replaced by {slot.pid}")
            elif not slot.lost:
                slot.lost = True
                changes.append(f"{slot.name}: pid {slot.pid} gone")
        return changes


@dataclass
class LeakRow:
    slot: str
    pids: list[int]
    before: dict | None
    after: dict | None
    problems: list[str] = field(default_factory=list)
    lost: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def compare_slot(slot: Slot, before: ProcessSample, after: ProcessSample | None,
                 rss_tolerance: float) -> LeakRow:
    """A slot's figures after the warm-up (`before`) against the end (`after`)."""
    row = LeakRow(slot.name, list(slot.pids), before.as_dict(),
                  after.as_dict() if after else None, lost=slot.lost)
    if slot.lost:
        return row
    if after is None:
        row.problems.append("process gone")
        return row
    if after.state == "Z":
        row.problems.append("zombie")
        return row
    if after.rss_kib - before.rss_kib > rss_tolerance * before.rss_kib:  # shrinking is fine
        change = (after.rss_kib - before.rss_kib) / before.rss_kib
        row.problems.append(f"RSS {change:+.1%} (limit +{rss_tolerance:.0%})")
    if before.fds is not None and after.fds is not None and after.fds > before.fds:
        row.problems.append(f"file descriptors {before.fds} -> {after.fds}")
    if after.threads > before.threads:
        row.problems.append(f"threads {before.threads} -> {after.threads}")
    return row


def compare(slots: Slots, baseline: dict[int, ProcessSample],
            final: dict[int, ProcessSample], rss_tolerance: float) -> list[LeakRow]:
    """One row per slot, and one per process of the final tree no slot holds (a process
    started after the warm-up that is still there: reported, a zombie is a problem)."""
    rows = [compare_slot(slot, baseline[slot.pids[0]], final.get(slot.pid), rss_tolerance)
            for slot in slots.slots.values()]
    held = {pid for slot in slots.slots.values() for pid in slot.pids}
    for pid, sample in final.items():
        if pid in held:
            continue
        row = LeakRow(f"new:{sample.role}", [pid], None, sample.as_dict())
        row.problems.append("zombie" if sample.state == "Z" else "started after the warm-up")
        rows.append(row)
    return rows


def zombies(tree: dict[int, ProcessSample]) -> list[int]:
    return [pid for pid, sample in tree.items() if sample.state == "Z"]
