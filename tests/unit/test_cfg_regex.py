"""constrained/cfg_regex.py: a context-free grammar's nesting-bounded regular subset (the ebnf steering shadow).

Truth: the `lark` parser on an independent Lark grammar of the same language. Over every string of a small
alphabet up to a length: whatever the regex matches, the grammar accepts (a subset: steering onto it never
leaves the grammar); whatever the grammar accepts with nesting within the bound, the regex matches (the
subset is not needlessly small); repetition is not bounded (long lists match).
"""

from __future__ import annotations

import itertools
import re

import pytest

from radixrt.runtime.constrained.cfg_regex import MAX_NESTING, cfg_regex
from radixrt.runtime.constrained.regex_builder import GrammarError

lark = pytest.importorskip("lark")

NESTED = (
    'root ::= list\nlist ::= "[" (item ("," item)*)? "]"\nitem ::= list | [a-z]',
    'start: list\nlist: "[" (item ("," item)*)? "]"\nitem: list | /[a-z]/',
)
ARITH = (
    'root ::= expr\nexpr ::= term (op term)*\nop ::= "+" | "*"\nterm ::= [0-9] | "(" expr ")"',
    'start: expr\nexpr: term (op term)*\nop: "+" | "*"\nterm: /[0-9]/ | "(" expr ")"',
)
LARK_WITH_IGNORE = 'start: "a" ("," "a")*\n%import common.WS\n%ignore WS'


def accepts(parser, text: str) -> bool:
    try:
        parser.parse(text)
        return True
    except lark.exceptions.LarkError:
        return False


def depth(text: str, open_: str) -> int:
    d = best = 0
    for ch in text:
        d += ch == open_
        d -= ch in ")]"
        best = max(best, d)
    return best


@pytest.mark.parametrize(
    "gbnf,lark_text,alphabet,open_,length", [(*NESTED, "[],a", "[", 8), (*ARITH, "1+*()", "(", 7)]
)
def test_the_regex_is_the_grammar_within_the_nesting_bound(
    gbnf, lark_text, alphabet, open_, length
):
    rx = re.compile(cfg_regex(gbnf))
    parser = lark.Lark(lark_text, parser="earley")
    # the top rule counts once: list in list in list is nesting 3 for the lists, one less for the parens
    bound = MAX_NESTING if open_ == "[" else MAX_NESTING - 1
    matched = 0
    for n in range(1, length + 1):
        for chars in itertools.product(alphabet, repeat=n):
            text = "".join(chars)
            in_regex = rx.fullmatch(text) is not None
            if in_regex:
                assert accepts(parser, text), f"{text!r} is not in the grammar"
                matched += 1
            elif depth(text, open_) <= bound:
                assert not accepts(parser, text), f"{text!r} is in the grammar within the bound"
    assert matched > 20


def test_repetition_is_not_bounded():
    assert re.fullmatch(cfg_regex(NESTED[0]), "[" + ",".join("a" * 1 for _ in range(50)) + "]")
    assert re.fullmatch(cfg_regex(ARITH[0]), "+".join("1" for _ in range(60)))


def test_ignored_text_is_allowed_around_and_between_terminals():
    rx = cfg_regex(LARK_WITH_IGNORE)
    for text in ("a , a,a", " a ,a ,a ", "a"):
        assert re.fullmatch(rx, text), text
    assert not re.fullmatch(rx, "a,,a")


def test_repetition_of_alternatives_is_not_bounded():
    rx = cfg_regex('root ::= ("x" | "yz")+ "."')
    assert re.fullmatch(rx, "xyz" * 20 + ".") and not re.fullmatch(rx, "xy.")


def test_any_failure_reading_a_grammar_is_a_grammar_error():
    with pytest.raises(GrammarError):
        cfg_regex('start: A "x"\n%declare A')  # a terminal with no pattern


def test_what_lark_cannot_read_is_a_grammar_error():
    with pytest.raises(GrammarError, match="no regular subset"):
        cfg_regex("root ::= (unclosed")
