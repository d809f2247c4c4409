"""IncrementalDetokenizer: streamed deltas concatenate to the full decode, never show a broken
character, never split a stop string, and trim at the first stop string (OpenAI semantics)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixrt.runtime.messages import BatchTokenOut, DetokenizeReq, TokenOut, output_dicts
from radixrt.runtime.request.incremental_detokenizer import IncrementalDetokenizer
from radixrt.runtime.serving.backend.detokenizer import DetokenizerManager

EOS = 1000


class ByteTokenizer:
    """Each id < 256 is one byte; ids 256.. are multi-byte pieces; EOS is a special token.
    decode() joins the bytes and decodes UTF-8 with replacement, like byte-level BPE decoders do."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = [bytes([i]) for i in range(256)] + pieces

    def encode(self, text: str, rng: random.Random) -> list[int]:
        data, ids, i = text.encode(), [], 0
        while i < len(data):  # random segmentation into single bytes and known pieces
            for pid in rng.sample(range(256, len(self.pieces)), len(self.pieces) - 256):
                if data.startswith(self.pieces[pid], i) and rng.random() < 0.7:
                    ids.append(pid)
                    i += len(self.pieces[pid])
                    break
            else:
                ids.append(data[i])
                i += 1
        return ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        parts = [
            b"<eos>" if t == EOS else self.pieces[t]
            for t in ids
            if not (t == EOS and skip_special_tokens)
        ]
        return b"".join(parts).decode("utf-8", errors="replace")


BYTE_TOK = ByteTokenizer(
    [b"hello", b" world", "é".encode(), "你好".encode(), "🎉".encode()[:2], b"STOP", b"\n\n"]
)


def run_stream(
    tok, ids: list[int], stop=(), chunks=None, rng=None, skip=True
) -> tuple[list[str], IncrementalDetokenizer]:
    rng = rng or random.Random(0)
    detok = IncrementalDetokenizer(tok, list(stop), skip_special_tokens=skip)
    out, i = [], 0
    while i < len(ids):
        k = chunks.pop(0) if chunks else rng.randint(1, 3)
        step = ids[i : i + k]
        i += k
        out.append(detok.feed(step, finished=i >= len(ids)))
    if not ids:
        out.append(detok.feed([], finished=True))
    return out, detok


text_st = st.text(alphabet=st.sampled_from(list("ab lo\néSTOP你好🎉x")), max_size=40)


@settings(max_examples=200, deadline=None)
@given(text=text_st, seed=st.integers(0, 2**16))
def test_deltas_concatenate_to_full_decode_without_broken_chars(text, seed):
    rng = random.Random(seed)
    ids = BYTE_TOK.encode(text, rng)
    deltas, _ = run_stream(BYTE_TOK, ids, rng=rng)
    assert "".join(deltas) == text
    assert all("\ufffd" not in d for d in deltas)  # a multi-byte char is never shown half done


@settings(max_examples=300, deadline=None)
@given(
    text=text_st,
    stops=st.lists(st.sampled_from(["STOP", "lo", "\n\n", "好🎉", "ab a", "x"]), max_size=3),
    seed=st.integers(0, 2**16),
)
def test_stop_strings_trimmed_at_first_occurrence_and_never_leaked(text, stops, seed):
    rng = random.Random(seed)
    ids = BYTE_TOK.encode(text, rng)
    deltas, detok = run_stream(BYTE_TOK, ids, stop=stops, rng=rng)
    positions = [(text.find(s), s) for s in stops if s in text]
    expected = text[: min(positions)[0]] if positions else text
    assert "".join(deltas) == expected
    # Nothing sent was ever taken back, so no chunk may carry the start of the stop string either.
    sent = ""
    for d in deltas:
        sent += d
        assert expected.startswith(sent)
    if positions:
        first = min(p for p, _ in positions)
        assert detok.matched_stop in stops and text.startswith(detok.matched_stop, first)
    else:
        assert detok.matched_stop is None


def test_stop_prefix_held_until_resolved():
    detok = IncrementalDetokenizer(BYTE_TOK, ["STOP"])
    assert detok.feed(list(b"abS")) == "ab"  # "S" may start "STOP"
    assert detok.feed(list(b"T")) == ""
    assert detok.feed(list(b"x")) == "STx"  # it did not: released
    assert detok.feed(list(b"ST")) == ""
    assert detok.feed(list(b"OPmore")) == ""  # cut at the stop string
    assert detok.matched_stop == "STOP" and detok.sent_text == "abSTx"
    assert detok.feed(list(b"later"), finished=True) == ""


def test_held_stop_prefix_released_when_finished():
    detok = IncrementalDetokenizer(BYTE_TOK, ["STOP"])
    assert detok.feed(list(b"abST")) == "ab"
    assert detok.feed([], finished=True) == "ST"
    assert detok.matched_stop is None


def test_incomplete_utf8_held_then_flushed_at_finish():
    e = "é".encode()
    detok = IncrementalDetokenizer(BYTE_TOK)
    assert detok.feed([ord("a"), e[0]]) == "a"
    assert detok.feed([e[1]]) == "é"
    assert detok.feed([e[0]], finished=True) == "\ufffd"  # the model really ended mid-character


def test_special_tokens_skipped_or_kept():
    assert run_stream(BYTE_TOK, list(b"hi") + [EOS], chunks=[1, 2])[0] == ["h", "i"]
    assert "".join(run_stream(BYTE_TOK, list(b"hi") + [EOS], skip=False)[0]) == "hi<eos>"


def test_manager_registers_trims_and_drops_after_early_stop():
    mgr = DetokenizerManager(BYTE_TOK)
    mgr.register(DetokenizeReq(rid="a", sampling_params={"stop": ["STOP"]}))
    mgr.register(DetokenizeReq(rid="b"))

    def out(rid, ids, reason=None):
        return TokenOut(rid=rid, new_ids=ids, finished_reason=reason)

    r = output_dicts(
        mgr.handle(BatchTokenOut(outputs=[out("a", list(b"xyST")), out("b", list(b"hello"))]))
    )
    assert [(o["rid"], o["text"], o["finished_reason"]) for o in r] == [
        ("a", "xy", None),
        ("b", "hello", None),
    ]
    # the stop string completes here, before the scheduler notices: reported once, later deltas dropped
    r = output_dicts(mgr.handle(BatchTokenOut(outputs=[out("a", list(b"OPz"))])))
    assert r[0]["text"] == "" and r[0]["finished_reason"] == {"type": "stop", "matched": "STOP"}
    assert (
        mgr.handle(
            BatchTokenOut(outputs=[out("a", [EOS], {"type": "stop", "matched": EOS})])
        ).outputs
        == []
    )
    assert "a" not in mgr.states and "a" not in mgr.done_early
    r = mgr.handle(BatchTokenOut(outputs=[out("b", [], {"type": "abort", "message": "x"})])).outputs
    assert r[0].finished_reason["type"] == "abort" and "b" not in mgr.states


@pytest.fixture(scope="module")
def bpe_tokenizer():
    """A real byte-level BPE (HF tokenizers) trained here on text with multi-byte characters."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [
        "héllo wörld 你好世界 🎉🎉 naïve café",
        "the quick brown fox 日本語 ✓✓",
        "STOP here\n\nnext",
    ] * 20
    tok.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=400,
            special_tokens=["<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.mark.parametrize(
    "text", ["héllo wörld 你好世界 🎉🎉", "naïve café ✓ 日本語 STOP here\n\nnext", "🎉x🎉 y"]
)
def test_real_bpe_tokenizer_stream_matches_decode(bpe_tokenizer, text):
    ids = bpe_tokenizer.encode(text)
    assert bpe_tokenizer.decode(ids) == text
    for seed in range(5):
        deltas, _ = run_stream(bpe_tokenizer, ids, rng=random.Random(seed))
        assert "".join(deltas) == text and all("\ufffd" not in d for d in deltas)
    deltas, detok = run_stream(bpe_tokenizer, ids, stop=["\n\n", "🎉 y"], rng=random.Random(1))
    cut = min([i for i in (text.find("\n\n"), text.find("🎉 y")) if i >= 0], default=len(text))
    assert "".join(deltas) == text[:cut]


def test_manager_fails_one_request_whose_text_breaks_and_serves_the_rest():
    class Exploding(ByteTokenizer):
        def decode(self, ids, skip_special_tokens=True):
            if 666 in ids:
                raise RuntimeError("cannot decode this id")
            return super().decode(ids, skip_special_tokens)

    mgr = DetokenizerManager(Exploding([]))
    mgr.register(DetokenizeReq(rid="a"))
    mgr.register(DetokenizeReq(rid="b"))
    out = mgr.handle(
        BatchTokenOut(
            outputs=[
                TokenOut(rid="a", new_ids=list(b"ok"), finished_reason=None),
                TokenOut(rid="b", new_ids=[104, 666], finished_reason=None),
            ]
        )
    )
    out = output_dicts(out)
    assert out[0]["text"] == "ok" and out[0]["finished_reason"] is None
    assert out[1]["finished_reason"]["type"] == "abort" and out[1]["error_status"] == 500
    assert out[1]["abort_scheduler"] and "detokenizing failed" in out[1]["error"]
    # later deltas of the failed one are dropped; the other goes on
    out = mgr.handle(
        BatchTokenOut(
            outputs=[
                TokenOut(rid="b", new_ids=[105], finished_reason=None),
                TokenOut(rid="a", new_ids=list(b"!"), finished_reason={"type": "length"}),
            ]
        )
    )
    assert [(o.rid, o.text) for o in out.outputs] == [("a", "!")]
