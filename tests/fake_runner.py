"""A model runner without a model, for testing the scheduler, radix cache and pool.

Its "KV" per slot records which token sat at which position. Before every forward it
checks that each request's prefix slots hold exactly that request's tokens (so a wrong
page, a stale cache entry or an overwritten shared page shows up at once), and its
next token is a pure function of the token sequence read back from that KV. The truth
for a whole request is `reference_output`, computed from the token ids alone.
"""

from __future__ import annotations

from radixrt.runtime.core.plan import ItemResult, PlanItem


def next_token(seq: list[int], vocab: int) -> int:
    h = 0
    for t in seq[-8:]:
        h = (h * 1_000_003 + t + 7) % 2_147_483_647
    return (h + len(seq)) % vocab


def beam_offers(seq: list[int], vocab: int, num: int) -> list[tuple[float, int]]:
    """A beam's best `num` (logprob, token) continuations of seq: a pure function of the tokens
    (distinct values, so the search has no ties), best first."""
    h = 0
    for t in seq[-8:]:
        h = (h * 1_000_003 + t + 11) % 2_147_483_647
    scores = [
        -(((h + 7919 * t) * 2_654_435_761) % 1_000_003) / 100_000 - t * 1e-7 for t in range(vocab)
    ]
    return sorted(((lp, t) for t, lp in enumerate(scores)), reverse=True)[:num]


def reference_output(
    prompt: list[int], max_new_tokens: int, vocab: int, eos: int | None
) -> list[int]:
    seq, out = list(prompt), []
    while len(out) < max_new_tokens:
        t = next_token(seq, vocab)
        out.append(t)
        seq.append(t)
        if t == eos:
            break
    return out


class FakeTokenizer:
    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + t % 26) for t in ids if not (skip_special_tokens and t == 0))

    def encode(self, text, add_special_tokens=False):
        return [ord(c) - ord("a") + 1 for c in text]


class FakeRunner:
    def __init__(
        self,
        num_pages: int,
        page_size: int = 1,
        vocab_size: int = 50,
        eos: int | None = 0,
        context_length: int = 4096,
        max_rows: int = 16,
        loras: tuple[str, ...] = (),
    ):
        self.num_pages = num_pages
        self.page_size = page_size
        self.vocab_size = vocab_size
        self.eos_token_ids = [] if eos is None else [eos]
        self.context_length = context_length
        self.max_rows = max_rows
        self.tokenizer = FakeTokenizer()
        self.model_path = "fake"
        self.dtype_name = "fake"
        self.kv_bytes_per_token = self.kv_pool_bytes = self.kv_cache_dtype = None  # no real pool
        self.exit_on_rank_loss = False
        self.loras = list(loras)  # LoRA adapters it "serves" (outputs ignore them)
        self.lora_steps: list[dict[int, str]] = []  # each forward's slot -> adapter
        self.kv: dict[int, tuple[int, int]] = {}  # slot -> (position, token)
        self.table: dict[int, dict[int, int]] = {}  # row -> position -> slot
        self.num_forwards = 0
        self.forward_tokens = 0
        self.num_page_copies = 0
        self.num_copy_steps = 0

    def make_kv_tier(self, config) -> "FakeTierStore":
        num_pages = int(self.num_pages * config.hicache_ratio)
        self.kv_tier = FakeTierStore(self.kv, self.page_size, num_pages)
        return self.kv_tier

    def close(self) -> None:
        pass

    def lora_names(self) -> list[str]:
        return list(self.loras)

    def read_lora(self, name: str, path: str) -> str:
        return name

    def install_lora(self, adapter: str) -> None:
        self.loras.append(adapter)

    def unload_lora(self, name: str) -> None:
        if name not in self.loras:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded")
        self.loras.remove(name)

    def run(self, plan: list[PlanItem], mask_sources: list = ()) -> list[ItemResult]:
        self.num_forwards += 1
        for it in plan:  # a constrained pick names its mask source in this step's list
            assert all(p.mask is None or 0 <= p.mask < len(mask_sources) for p in it.picks)
        rows = [it.row for it in plan]
        assert len(set(rows)) == len(rows), "a table row twice in one batch"
        slots: dict[int, str] = {}
        for it in plan:  # one adapter per slot in a step, and a slot for every adapter's item
            assert (it.lora is None) == (it.lora_slot is None)
            if it.lora_slot is not None:
                assert slots.setdefault(it.lora_slot, it.lora) == it.lora
        self.lora_steps.append(slots)
        written: set[int] = set()
        results = []
        self.num_copy_steps += any(it.page_copies for it in plan)
        # page copies (forked samples) happen before anything is written, as in the runner
        for it in plan:
            for src, dst in it.page_copies:
                for off in range(self.page_size):
                    if src * self.page_size + off in self.kv:
                        self.kv[dst * self.page_size + off] = self.kv[src * self.page_size + off]
                    else:
                        self.kv.pop(dst * self.page_size + off, None)
                self.num_page_copies += 1
        for it in plan:
            end = it.computed_len + len(it.new_ids)
            row = self.table.setdefault(it.row, {})
            for k, pos in enumerate(range(it.write_start, end)):
                row[pos] = it.slots[k]
            fill = it.prompt_ids + it.output_ids
            num_own = len(it.new_ids) - it.num_draft  # the request's own tokens, then its draft
            assert fill[it.computed_len : it.computed_len + num_own] == it.new_ids[:num_own], (
                "new_ids are not the next tokens"
            )
            assert it.computed_len + num_own == len(fill) or not it.num_draft, (
                "a draft fed before the last token"
            )
            assert len(it.picks) in (
                (0, 1) if not it.num_draft else (it.num_draft, it.num_draft + 1)
            )
            for j, pick in enumerate(it.picks):  # pick j sees draft tokens 0..j-1 as output
                assert pick.output_ids == it.output_ids + it.new_ids[num_own : num_own + j]
            seq = []
            for pos in range(it.computed_len):
                got = self.kv.get(row[pos])
                assert got == (pos, fill[pos]), (
                    f"row {it.row}: slot {row[pos]} of position {pos} holds {got}"
                )
                seq.append(got[1])
            for pos, tok in zip(range(it.computed_len, end), it.new_ids):
                slot = row[pos]
                assert slot not in written, "two tokens written to one slot in a step"
                written.add(slot)
                self.kv[slot] = (pos, tok)
                seq.append(tok)
            self.forward_tokens += len(it.new_ids)
            res = ItemResult()
            if it.picks:
                # a pick after the own tokens and after each draft token
                picks = [
                    next_token(seq[: it.computed_len + num_own + j], self.vocab_size)
                    for j in range(it.num_draft + 1)
                ]
                res.next_id, res.logprob = picks[0], -1.0
                if it.picks[0].beam_candidates:
                    own = seq[: it.computed_len + num_own]
                    res.beam_offers = beam_offers(own, self.vocab_size, it.picks[0].beam_candidates)
                if it.num_draft:
                    res.draft_results = [ItemResult(next_id=t, logprob=-1.0) for t in picks[1:]]
            results.append(res)
        return results


class FakeDraftGrammar:
    """Stands in for a grammar state that drafts: it proposes the fake model's own continuation
    with some tokens wrong on purpose, so the scheduler's verification must keep the output
    equal to `reference_output` whatever the drafts hold. Masks are not modelled."""

    def __init__(self, req, vocab: int, rng, wrong: float = 0.3, max_len: int = 5):
        self.req, self.vocab, self.rng, self.wrong, self.max_len = req, vocab, rng, wrong, max_len

    def draft(self, max_tokens: int) -> tuple[list[int], list[int]]:
        seq, out = list(self.req.fill_ids), []
        for _ in range(min(self.rng.randrange(0, self.max_len + 1), max(max_tokens, 0))):
            t = next_token(seq, self.vocab)
            if self.rng.random() < self.wrong:
                t = (t + 1 + self.rng.randrange(self.vocab - 1)) % self.vocab
            out.append(t)
            seq.append(t)
        return out, list(range(len(out)))

    def accept(self, token_id: int) -> None:
        pass

    def ends_at(self, state: int) -> bool:
        return False

    def at(self, state: int, budget: int) -> "FakeDraftGrammar":
        return self  # the mask source of a draft position (masks are not modelled)

    def for_budget(self, budget: int) -> "FakeDraftGrammar":
        return self  # no budget steering either

    def is_final(self) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


class FakeTierStore:
    """The second cache tier over a slot -> (position, token) dict (FakeRunner.kv, or a test's): write copies
    pool pages' entries into tier pages, read copies them back, so a wrong or stale load shows up in the
    runner's prefix check. `corrupt` holds tier pages whose checksum "fails" on the next read."""

    page_bytes = 1

    def __init__(self, kv: dict, page_size: int, num_pages: int):
        self.kv, self.page_size, self.num_pages = kv, page_size, num_pages
        self.pages: dict[int, list] = {}
        self.corrupt: set[int] = set()
        self.writes = self.reads = self.pages_read = 0
        self.log: list[tuple[str, list[int]]] = []  # ("write" | "read", tier pages) in call order

    def _slots(self, page: int) -> range:
        return range(page * self.page_size, (page + 1) * self.page_size)

    def write(self, pool_pages: list[int], tier_pages: list[int]) -> None:
        assert len(pool_pages) == len(tier_pages) and len(set(tier_pages)) == len(tier_pages)
        assert all(0 <= p < self.num_pages for p in tier_pages)
        for src, dst in zip(pool_pages, tier_pages):
            self.pages[dst] = [self.kv.get(slot) for slot in self._slots(src)]
            self.corrupt.discard(dst)
        self.writes += 1
        self.log.append(("write", list(tier_pages)))

    def read(self, tier_pages: list[int], pool_pages: list[int]):
        self.reads += 1
        self.log.append(("read", list(tier_pages)))
        for i, (src, dst) in enumerate(zip(tier_pages, pool_pages)):
            if src in self.corrupt:
                return i
            assert src in self.pages, f"tier page {src} read before any write"
            for slot, entry in zip(self._slots(dst), self.pages[src]):
                if entry is None:
                    self.kv.pop(slot, None)
                else:
                    self.kv[slot] = entry
            self.pages_read += 1
        return None
