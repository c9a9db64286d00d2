"""What the speculator asks of a proposer (one per method, registered in PROPOSERS)."""


class Proposer:

    def propose(self, request_id: str, tokens: list[int], k: int) -> list[int]:
        """At most k draft tokens to follow `tokens` (the request's prompt and output);
        empty: nothing worth verifying (the request decodes plainly this step)."""
        raise NotImplementedError

    def propose_all(self, items: list[tuple[str, list[int], int]]) -> list[list[int]]:
        """Drafts of a step's requests, each (request id, tokens, k): one by one unless a
        proposer batches them (a draft model)."""
        return [self.propose(*item) for item in items]

    def finish(self, request_id: str, output_token_ids: list[int]) -> None:
        """The request left (its output, when it finished, else empty): its state goes."""
