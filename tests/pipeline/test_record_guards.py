"""OUT's record, field by field (no cluster): what is a record of ours and what is not (a field
we never write, ``seed`` outside ``generated`` included), each refusal's words, the longest
record read, and the words a run's option mismatch is told in."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.store.record import (
    MAX_RECORD_CHARS,
    MAX_TEXT_CHARS,
    STANDARDIZE_FIELDS,
    Difference,
    OutRecord,
    alpha_flag,
    differences,
    of_array,
    of_attributes,
    parse,
)


@pytest.mark.parametrize(
    "stored",
    [
        {"seed": 3},  # a dataclass field, but stored only as generated.seed
        {"complete": True, "seed": 3},
        {"fingerprint": "f0", "owner": "someone else"},
        {"generated": {"seed": 1}, "seed": 1},
    ],
)
def test_a_field_this_tool_never_writes_makes_no_record(stored: dict[str, Any]) -> None:
    assert parse(stored) is None
    assert parse(json.dumps(stored)) is None
    assert of_attributes({"tilegemm": json.dumps(stored)}) is None


def test_unknown_fields_are_named_three_at_most() -> None:
    with pytest.raises(ValueError, match=r"^unknown field\(s\) \['a', 'b', 'c'\]$"):
        OutRecord.from_dict({"d": 1, "c": 1, "b": 1, "a": 1, "complete": True})
    with pytest.raises(ValueError, match=r"^unknown field\(s\) \['seed'\]$"):
        OutRecord.from_dict({"seed": 1})


def test_a_null_field_is_refused_not_taken_as_unset() -> None:
    with pytest.raises(ValueError, match=r"^a field is null \(an unset field is left out\)$"):
        OutRecord.from_dict({"fingerprint": "f0", "alpha": None})
    assert parse({"verified": None}) is None


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"complete": 1}, r"^complete is 1, not a boolean$"),
        ({"verified": "yes"}, r"^verified is 'yes', not a boolean$"),
        ({"transpose_a": None}, r"^transpose_a is None, not a boolean$"),  # only two may be unset
        ({"transpose_b": 0}, r"^transpose_b is 0, not a boolean$"),
        ({"symmetric": None}, r"^symmetric is None, not a boolean$"),
        ({"fingerprint": 7}, rf"^fingerprint is not a string of at most {MAX_TEXT_CHARS} "),
        ({"fingerprint": "f" * (MAX_TEXT_CHARS + 1)}, r"^fingerprint is not a string"),
        (
            {"precision": "p" * (MAX_TEXT_CHARS + 1)},
            r"^precision is not a string of at most 256 characters$",
        ),
        ({"precision": b"tf32"}, r"^precision is not a string"),
        ({"tile_shape": [2, 2]}, r"^tile_shape is \[2, 2\], not two integers >= 1$"),
        ({"tile_shape": (2,)}, r"^tile_shape is \(2,\), not two integers >= 1$"),
        ({"tile_shape": (2, 2, 2)}, r"^tile_shape is \(2, 2, 2\), not"),
        ({"tile_shape": (0, 2)}, r"^tile_shape is \(0, 2\), not"),
        ({"tile_shape": (2, 0)}, r"^tile_shape is \(2, 0\), not"),
        ({"tile_shape": (True, 2)}, r"^tile_shape is \(True, 2\), not"),
        ({"tile_shape": (2.0, 2)}, r"^tile_shape is \(2\.0, 2\), not"),
        ({"alpha": float("inf")}, r"^alpha is inf, not a finite number$"),
        ({"alpha": float("nan")}, r"^alpha is nan, not a finite number$"),
        ({"alpha": "2"}, r"^alpha is '2', not a finite number$"),
        ({"alpha": True}, r"^alpha is True, not a finite number$"),
        ({"seed": -1}, r"^seed is -1, not an integer >= 0$"),
        ({"seed": True}, r"^seed is True, not an integer >= 0$"),
        ({"seed": 1.0}, r"^seed is 1\.0, not"),
        (
            {"standardize": {"mode": "center", "owner": "x"}},
            r"^standardize is \{'mode': 'center', 'owner': 'x'\}, not a standardization's record$",
        ),
        ({"standardize": {"mode": "c" * 65}}, r"^standardize is"),
        ({"standardize": {"count": -(2**62) - 1}}, r"^standardize is"),
        ({"standardize": {"count": 1.5}}, r"^standardize is"),
        ({"standardize": {"count": True}}, r"^standardize is"),
        ({"standardize": {"digest": ["a"]}}, r"^standardize is"),
        ({"standardize": [("mode", "center")]}, r"^standardize is"),
    ],
)
def test_a_field_of_the_wrong_type_is_refused_with_its_name(
    fields: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        OutRecord(**fields)


@pytest.mark.parametrize(
    "record",
    [
        OutRecord(complete=None, verified=None),
        OutRecord(fingerprint="f" * MAX_TEXT_CHARS, precision="p" * MAX_TEXT_CHARS),
        OutRecord(tile_shape=(1, 1)),
        OutRecord(alpha=-3),
        OutRecord(seed=0),
        OutRecord(standardize={}),
        OutRecord(standardize={"mode": "c" * 64, "count": -(2**62), "divisor": 2**70}),
        OutRecord(standardize=dict.fromkeys(STANDARDIZE_FIELDS, 1)),
    ],
)
def test_the_edges_of_each_field_are_a_record(record: OutRecord) -> None:
    assert parse(record.to_json()) == record


@pytest.mark.parametrize(
    ("stored", "words"),
    [
        ({"tile_shape": "2x2"}, r"^tile_shape is '2x2', not a list$"),
        ({"tile_shape": (2, 2)}, r"^tile_shape is \(2, 2\), not a list$"),
        ({"generated": 3}, r"^generated is 3, not \{'seed': N\}$"),
        ({"generated": {"seed": 1, "x": 2}}, r"^generated is \{'seed': 1, 'x': 2\}, not"),
        ({"generated": {}}, r"^generated is \{\}, not \{'seed': N\}$"),
        ({"generated": {"seed": -1}}, r"^generated\.seed is -1, not an integer >= 0$"),
        ({"generated": {"seed": "1"}}, r"^generated\.seed is '1', not an integer >= 0$"),
        ({"generated": {"seed": False}}, r"^generated\.seed is False, not"),
    ],
)
def test_a_stored_form_of_the_wrong_shape_is_refused(stored: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        OutRecord.from_dict(stored)


def test_the_stored_form_reads_back_typed() -> None:
    record = OutRecord.from_dict({"tile_shape": [3, 4], "alpha": 2, "generated": {"seed": 5}})
    assert record == OutRecord(tile_shape=(3, 4), alpha=2.0, seed=5)
    assert type(record.alpha) is float and type(record.seed) is int
    assert isinstance(record.tile_shape, tuple)
    assert OutRecord.from_dict({"generated": {"seed": 0}}).seed == 0


def test_the_stored_form_holds_only_what_is_set() -> None:
    assert OutRecord(transpose_a=False, transpose_b=True, symmetric=False).to_dict() == {
        "transpose_b": True
    }
    assert OutRecord(complete=False, verified=False).to_dict() == {
        "complete": False,
        "verified": False,
    }
    std = {"mode": "center", "ddof": 1}
    assert OutRecord(standardize=std, seed=0).to_dict() == {
        "generated": {"seed": 0},
        "standardize": std,
    }
    assert OutRecord(symmetric=True, alpha=0.5).to_json() == '{"alpha": 0.5, "symmetric": true}'
    assert list(OutRecord(symmetric=True, complete=True).to_dict()) == ["complete", "symmetric"]


def test_the_longest_record_read_is_max_record_chars() -> None:
    text = json.dumps({"fingerprint": "f0"})
    longest = text + " " * (MAX_RECORD_CHARS - len(text))
    assert parse(longest) == OutRecord(fingerprint="f0")
    assert parse(longest + " ") is None


def test_what_is_no_record() -> None:
    assert parse("[" * 100_000) is None  # deep enough to exhaust the parser
    assert parse(json.dumps([1])) is None
    assert parse(json.dumps("{}")) is None
    assert of_attributes(["tilegemm"]) is None  # not a mapping
    assert of_attributes({}) is None

    class Array:
        attrs = {"tilegemm": json.dumps({"seed": 1})}

    assert of_array(Array()) is None
    Array.attrs = {"tilegemm": json.dumps({"generated": {"seed": 1}})}
    assert of_array(Array()) == OutRecord(seed=1)


PLAIN, GRAM = OutRecord(), OutRecord(symmetric=True)
NO_STD = "no --center, --scale or --kinship"
WITHOUT_STD = "without --center, --scale or --kinship"


@pytest.mark.parametrize(
    ("started", "given", "found"),
    [
        (PLAIN, PLAIN, []),
        (
            GRAM,
            PLAIN,
            [Difference("as a Gram product (`gram`)", "a plain product (`multiply`)", "`gram`")],
        ),
        (
            PLAIN,
            GRAM,
            [
                Difference(
                    "as a plain product (`multiply`)", "a Gram product (`gram`)", "`multiply`"
                )
            ],
        ),
        (
            OutRecord(transpose_a=True),
            PLAIN,
            [Difference("with --transpose-a", "no --transpose-a", "with --transpose-a")],
        ),
        (
            PLAIN,
            OutRecord(transpose_b=True),
            [Difference("without --transpose-b", "--transpose-b", "without --transpose-b")],
        ),
        (
            OutRecord(transpose_a=True, transpose_b=True),
            OutRecord(transpose_a=True, transpose_b=True),
            [],
        ),
        (
            OutRecord(symmetric=True, transpose_b=True),
            GRAM,
            [Difference("with --rows", "no --rows", "with --rows")],
        ),
        (
            GRAM,
            OutRecord(symmetric=True, transpose_b=True),
            [Difference("without --rows", "--rows", "without --rows")],
        ),
        (
            OutRecord(symmetric=True, transpose_a=True),
            GRAM,
            [],
        ),  # a Gram product has no --transpose-a
        (
            OutRecord(precision="tf32"),
            PLAIN,
            [Difference("with --precision tf32", "--precision fp32", "with --precision tf32")],
        ),
        (PLAIN, OutRecord(precision="fp32"), []),  # unrecorded is fp32
        (
            OutRecord(alpha=2.5),
            PLAIN,
            [Difference("with --alpha 2.5", "--alpha 1", "with --alpha 2.5")],
        ),
        (
            PLAIN,
            OutRecord(alpha=2.0),
            [Difference("with --alpha 1", "--alpha 2", "with --alpha 1")],
        ),
        (
            OutRecord(alpha=0.1),
            OutRecord(alpha=1 / 3),
            [Difference("with --alpha 0.1", "--alpha 0.3333333333333333", "with --alpha 0.1")],
        ),
        (
            OutRecord(symmetric=True, standardize={"mode": "center", "ddof": 1}),
            GRAM,
            [Difference("with --center --ddof 1", NO_STD, "with --center --ddof 1")],
        ),
        (
            GRAM,
            OutRecord(symmetric=True, standardize={"mode": "scale", "ddof": 1}),
            [Difference(WITHOUT_STD, "--scale", WITHOUT_STD)],
        ),
        (
            OutRecord(symmetric=True, standardize={"mode": "center"}),
            OutRecord(symmetric=True, standardize={"mode": "kinship"}),
            [Difference("with --center", "--kinship", "with --center")],
        ),
        (OutRecord(symmetric=True, standardize={"ddof": 1}), GRAM, []),  # no mode: none
    ],
)
def test_differences_in_flag_words(
    started: OutRecord, given: OutRecord, found: list[Difference]
) -> None:
    assert differences(started, given) == found


def test_every_difference_is_told_in_order() -> None:
    started = OutRecord(transpose_a=True, precision="bf16", alpha=3.0)
    given = OutRecord(transpose_b=True)
    assert [d.started for d in differences(started, given)] == [
        "with --transpose-a",
        "without --transpose-b",
        "with --precision bf16",
        "with --alpha 3",
    ]


def test_alpha_flag() -> None:
    assert alpha_flag(PLAIN) == "with --alpha 1"
    assert alpha_flag(OutRecord(alpha=-0.5)) == "with --alpha -0.5"
    assert alpha_flag(OutRecord(alpha=1e-7)) == "with --alpha 1e-07"
