"""The executor's side of re-forming one torch world over the node's ranks
(engine/node_reform.py; a rank's side: worker/world_reform.py).

Every rank is asked at once, at a new rendezvous generation. A rank lost before all have
said they are here calls it off (the abort key in the engine's store): the others keep
the worlds they had and answer "aborted", and the rank lost is taken like any other
(its groups out, replaced again). Only the ranks that answer "reformed" are in the new
world; one that fails or hangs in it is lost."""
import pickle
import time

from parashift.worker.worker import CONTROL_PREFIX


def reform_world(executor, members: tuple[int, ...]) -> bool:
    """Asks `members` (every live rank, none with a step in flight) to re-form one world;
    True once every one of them has."""
    replacements = executor.replacements
    replacements.generation += 1
    generation = replacements.generation
    message = CONTROL_PREFIX + pickle.dumps(("reform", generation, tuple(members)))
    for rank in members:
        try:
            executor.conns[rank].send_bytes(message)
        except OSError:
            executor._lose(rank, executor._death(rank))
    answers = _answers(executor, members, generation)
    if all(answers.get(rank) == "reformed" for rank in members):
        return True
    for rank, answer in answers.items():
        if answer == "reformed":  # in a world with a lost rank: its groups cannot step
            executor._lose(rank, f"worker rank {rank} re-formed its world with a rank lost "
                                 "meanwhile")
    return False


def _answers(executor, members: tuple[int, ...], generation: int) -> dict[int, str]:
    """Each live member's answer; once one is lost, the others are told to abort."""
    answers, deadline, aborted = {}, time.monotonic() + executor.timeout_s, False
    for rank in members:
        while rank not in executor.lost and rank not in answers:
            if not aborted and any(r in executor.lost for r in members):
                executor.store.set(f"reform{generation}/abort", b"1")
                aborted = True
            ready = executor._wait([executor.conns[rank]], deadline,
                                   watch=() if aborted else members)
            if ready:
                message = executor._read(rank)
                if message is not None and message[0] == "error":
                    executor._lose(rank, f"worker rank {rank} failed to re-form its world:"
                                         f"\n{message[1]}")
                elif message is not None:
                    answers[rank] = message[1]
            elif time.monotonic() >= deadline:
                executor._lose(rank, f"worker rank {rank} did not re-form its world within "
                                     f"{executor.timeout_s:.0f} s")
    return answers
