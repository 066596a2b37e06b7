"""Open-loop replay of recorded conversations on a running vLLM session, on the wall clock or on
the engine thread's CPU clock (a machine shared with other jobs)."""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class ReplayTurn:
    """One turn of a replayed conversation (a single request is a one-turn conversation)."""

    user_token_ids: tuple[int, ...]
    """Tokens the user adds (the whole prompt of a single request)."""
    num_output_tokens: int
    """Tokens to generate."""
    think_s: float = 0.0
    """Wait after the previous turn's reply before this turn arrives."""
    adapter: int | None = None
    """Adapter of this turn when it differs from the conversation's (a domain switch)."""


@dataclass(frozen=True)
class ReplayConversation:
    """Turns sent in order, each after the previous reply plus its think time."""

    arrival_s: float
    kind: str
    """"base", "lora" or "lora_p"."""
    adapter: int
    turns: tuple[ReplayTurn, ...]


class ReplayClock:
    """Seconds since the replay started. "wall": perf_counter, idle waits really sleep.
    "cpu": a virtual clock that advances by the engine thread's CPU seconds while it works and
    jumps to the next arrival while it is idle: on a machine shared with other jobs, the
    engine's own latencies without the time others held the cores (CPU engines only: a GPU's
    work is not the host thread's CPU time)."""

    def __init__(self, kind: str):
        if kind not in ("wall", "cpu"):
            raise ValueError(f"clock={kind!r}; allowed: 'wall', 'cpu'")
        self.kind, self.offset = kind, 0.0
        self.origin = self._raw()

    def _raw(self) -> float:
        return time.perf_counter() if self.kind == "wall" else time.thread_time()

    def now(self) -> float:
        """Seconds since the start."""
        return self._raw() - self.origin + self.offset

    def wait_until(self, t: float) -> None:
        """Idle until `t` (sleep on the wall clock, jump on the CPU clock)."""
        gap = t - self.now()
        if gap > 0 and self.kind == "wall":
            time.sleep(gap)
        elif gap > 0:
            self.offset += gap


def replay_open_loop(session, conversations: list[ReplayConversation],
                     clock: str = "cpu", on_record=None) -> list[dict]:
    """Serve `conversations` on a `VllmSession`, honouring their arrival times on `clock` (open
    loop: a late engine does not delay arrivals); a later turn's prompt is the whole history
    (earlier prompts and the tokens the engine generated) plus its user tokens, so prefix
    caching sees real prefixes.
    Returns one record per turn: arrival, first token and finish (seconds), tokens; each is
    also passed to `on_record` as it finishes (what an interrupted replay measured)."""
    import heapq

    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = session.llm.llm_engine
    queue = [(c.arrival_s, i, 0) for i, c in enumerate(conversations)]
    heapq.heapify(queue)
    history: dict[int, list[int]] = {i: [] for i in range(len(conversations))}
    live: dict[str, dict] = {}
    records: list[dict] = []
    timer = ReplayClock(clock)
    while queue or live:
        now = timer.now()
        while queue and queue[0][0] <= now:
            arrival, conv, turn = heapq.heappop(queue)
            c, t = conversations[conv], conversations[conv].turns[turn]
            prompt = history[conv] + list(t.user_token_ids)
            request_id = f"{conv}-{turn}"
            params = SamplingParams(max_tokens=t.num_output_tokens, temperature=0.0,
                                    ignore_eos=True, detokenize=False)
            adapter = c.adapter if t.adapter is None else t.adapter
            engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params,
                               lora_request=session.lora_request(c.kind, adapter))
            live[request_id] = dict(conv=conv, turn=turn, arrival_s=arrival, prompt=prompt,
                                    num_prompt_tokens=len(prompt), first_token_s=None,
                                    adapter=adapter)
        if not live:
            timer.wait_until(queue[0][0])
            continue
        outputs = engine.step()
        t_now = timer.now()
        for out in outputs:
            rec = live.get(out.request_id)
            if rec is None:
                continue
            if rec["first_token_s"] is None and out.outputs and out.outputs[0].token_ids:
                rec["first_token_s"] = t_now
            if out.finished:
                del live[out.request_id]
                tokens = list(out.outputs[0].token_ids)
                conv, turn = rec["conv"], rec["turn"]
                history[conv] = rec.pop("prompt") + tokens
                records.append(dict(rec, finish_s=t_now, num_output_tokens=len(tokens)))
                if on_record is not None:
                    on_record(records[-1])
                nxt = conversations[conv].turns[turn + 1:turn + 2]
                if nxt:
                    heapq.heappush(queue, (t_now + nxt[0].think_s, conv, turn + 1))
    return sorted(records, key=lambda r: (r["conv"], r["turn"]))
