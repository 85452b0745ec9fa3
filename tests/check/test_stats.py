"""The pure statistics and scoring of `chatfleet accuracy` against known values."""

from __future__ import annotations

import math
import random

import pytest
from scipy.stats import binomtest

from chatfleet.check.gsm8k import extract_model_answer, gsm8k_answer
from chatfleet.core.accuracy import (
    GSM8K_SUFFIX,
    Z95,
    AccuracyError,
    PairedTable,
    compare,
    final_answer_span,
    mcnemar_exact_p,
    paired_diff_ci,
    parse_dataset_lines,
    parse_number,
    score_answer,
    select_indices,
    summarize_target,
    wilson_interval,
)


def test_z_is_the_normal_975_quantile() -> None:
    assert abs(Z95 - 1.959963984540054) < 1e-12


def test_wilson_at_zero_and_at_n() -> None:
    z2 = Z95**2
    for n in (1, 10, 1319):
        lo, hi = wilson_interval(0, n)
        assert lo == 0.0 and hi == pytest.approx(z2 / (n + z2))
        lo, hi = wilson_interval(n, n)
        assert hi == 1.0 and lo == pytest.approx(n / (n + z2))
    assert wilson_interval(0, 10)[1] == pytest.approx(0.2775, abs=5e-5)


def test_wilson_is_symmetric_and_matches_scipy() -> None:
    rng = random.Random(5)
    for _ in range(200):
        n = rng.randint(1, 3000)
        k = rng.randint(0, n)
        lo, hi = wilson_interval(k, n)
        lo2, hi2 = wilson_interval(n - k, n)
        assert lo == pytest.approx(1 - hi2, abs=1e-12) and hi == pytest.approx(1 - lo2, abs=1e-12)
        ref = binomtest(k, n).proportion_ci(0.95, method="wilson")
        assert (lo, hi) == pytest.approx((ref.low, ref.high), abs=1e-9)
        assert lo <= k / n <= hi
    assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=5e-5)


def test_wilson_rejects_bad_counts() -> None:
    for k, n in ((0, 0), (-1, 5), (6, 5)):
        with pytest.raises(AccuracyError):
            wilson_interval(k, n)


def test_mcnemar_hand_worked_table() -> None:
    # 1 vs 6 discordant: P(X <= 1 | Bin(7, 1/2)) = (1 + 7) / 128, doubled = 0.125
    assert mcnemar_exact_p(1, 6) == pytest.approx(0.125, abs=1e-15)
    assert mcnemar_exact_p(6, 1) == pytest.approx(0.125, abs=1e-15)
    # 0 vs 5: 2 / 32
    assert mcnemar_exact_p(0, 5) == pytest.approx(0.0625, abs=1e-15)
    assert mcnemar_exact_p(0, 0) == 1.0
    assert mcnemar_exact_p(7, 7) == 1.0
    assert mcnemar_exact_p(3, 4) == 1.0
    # Cavo et al. 2012 (Fagerland, Lydersen & Laake, "Statistical analysis of contingency
    # tables", ch. 8): 6 vs 16 discordant pairs, exact conditional P = 0.052479
    assert mcnemar_exact_p(6, 16) == pytest.approx(0.052479, abs=5e-7)


def test_mcnemar_matches_scipy_binomtest() -> None:
    rng = random.Random(11)
    for _ in range(200):
        b, c = rng.randint(0, 400), rng.randint(0, 400)
        if b + c == 0:
            continue
        assert mcnemar_exact_p(b, c) == pytest.approx(binomtest(b, b + c).pvalue, rel=1e-9)
    with pytest.raises(AccuracyError):
        mcnemar_exact_p(-1, 3)


def test_newcombe_paired_interval_known_value() -> None:
    # Cavo 2012: both 59, A only 6, B only 16, neither 80; published Newcombe square-and-add
    # for p_A - p_B: -0.0621 (-0.1186 to -0.0046), so for p_B - p_A: 0.0046 to 0.1186
    t = PairedTable(59, 6, 16, 80)
    lo, hi = paired_diff_ci(t)
    assert (lo, hi) == pytest.approx((0.0046, 0.1186), abs=5e-5)
    swapped = paired_diff_ci(PairedTable(59, 16, 6, 80))
    assert swapped == pytest.approx((-hi, -lo), abs=1e-12)


def test_newcombe_degenerate_tables() -> None:
    lo, hi = paired_diff_ci(PairedTable(50, 0, 0, 50))
    assert lo < 0 < hi and lo == pytest.approx(-hi)
    lo, hi = paired_diff_ci(PairedTable(20, 0, 0, 0))  # both always right: a margin is empty
    assert lo < 0 < hi
    lo, hi = paired_diff_ci(PairedTable(0, 0, 10, 0))  # B always right, A never
    assert hi == 1.0 and 0.5 < lo < 1.0
    with pytest.raises(AccuracyError):
        paired_diff_ci(PairedTable(0, 0, 0, 0))


def test_compare_and_the_margin() -> None:
    a = [True] * 90 + [False] * 10
    b = [True] * 88 + [False] * 12
    doc = compare("bf16", a, "fp8", b, margin=0.02)
    assert (doc["both"], doc["a_only"], doc["b_only"], doc["neither"]) == (88, 2, 0, 10)
    assert doc["diff"] == pytest.approx(-0.02)
    assert doc["mcnemar_p"] == pytest.approx(0.5)
    lo, hi = doc["diff_ci95"]
    assert lo < -0.02 < hi and doc["within_margin"] is False
    assert compare("bf16", a, "fp8", b, margin=0.2)["within_margin"] is True
    assert doc["within_margin"] == (lo >= -0.02)
    with pytest.raises(AccuracyError):
        compare("a", [True], "b", [True, False], 0.02)


def test_summarize_target_counts_failures_as_wrong() -> None:
    s = summarize_target([True, True, False, False], failed=1)
    assert s["accuracy"] == 0.5 and s["n"] == 4 and s["correct"] == 2 and s["failed"] == 1
    assert s["ci95"] == list(wilson_interval(2, 4))


@pytest.mark.parametrize(("expected", "output", "correct", "extracted"), [
    ("18", "Working it out. The answer is 18.", True, "18"),
    ("18", "The answer is $18.00 per day.", True, "18"),
    ("1000", "So 10 x 100. The answer is 1,000.", True, "1000"),
    ("18", "First 3 + 15 = 18, so #### 18", True, "18"),
    ("42", "We get \\boxed{42}. Check: 40 + 2", True, "42"),
    ("42", "The final answer is:\n\n42", True, "42"),
    ("18", "3 + 15 = 18", True, "18"),  # no marker: the last number
    ("18", "The answer is 20.", False, "20"),
    ("18", "The answer is 18 eggs, or 36 halves", True, "18"),
    ("18", "I do not know.", False, None),
    ("18", "", False, None),
    ("2.5", "The answer is 2.50.", True, "2.50"),
    ("-3", "The answer is -3.", True, "-3"),
    ("paris", "Thinking.\nThe answer is Paris.", True, "paris"),
    ("Paris", "It is in France.\nParis", True, "paris"),
    ("paris", "The answer is Lyon.", False, "lyon"),
])
def test_score_answer(expected: str, output: str, correct: bool, extracted: str | None) -> None:
    s = score_answer(expected, output, extract_model_answer)
    assert (s.correct, s.extracted) == (correct, extracted)
    assert score_answer(expected, None, extract_model_answer).correct is False


def test_final_answer_span_and_numbers() -> None:
    assert final_answer_span("no marker here") is None
    assert final_answer_span("The answer is 3. Later: the answer is 4.\nmore") == "4."
    assert final_answer_span("The answer is 1,000 eggs, or 12 dozen") == "1,000 eggs"
    assert parse_number(" $1,234.0 ") == 1234
    assert parse_number("12 apples") is None


def test_parse_gsm8k_and_prompts_files() -> None:
    gsm = ['{"question": "Q one?", "answer": "1 + 1 = 2\\n#### 2"}', "",
           '{"question": "Q two?", "answer": "#### 1,000"}']
    ds = parse_dataset_lines(gsm, "g.jsonl", gsm8k_answer)
    assert ds.kind == "gsm8k" and [it.expected for it in ds.items] == ["2", "1000"]
    assert ds.items[1].index == 1 and ds.items[1].prompt == "Q two?" + GSM8K_SUFFIX
    prompts = ['{"prompt": "Capital of France? Answer in one word.", "answer": "Paris"}',
               '{"prompt": "2+2?", "answer": 4}', '{"prompt": "Half of 5?", "answer": "2.50"}']
    ds = parse_dataset_lines(prompts, "p.jsonl", gsm8k_answer)
    assert ds.kind == "prompts" and [it.expected for it in ds.items] == ["Paris", "4", "2.5"]
    assert ds.items[0].prompt == ds.items[0].question  # sent verbatim


@pytest.mark.parametrize(("lines", "message"), [
    (["{not json"], "line 1: bad JSON"),
    (["[1, 2]"], "expected a JSON object"),
    (['{"question": "q", "answer": "no final"}'], "no '#### N'"),
    (['{"prompt": "p"}'], "needs an 'answer'"),
    (['{"prompt": "", "answer": "x"}'], "non-empty string 'prompt'"),
    (['{"prompt": "p", "answer": true}'], "needs an 'answer'"),
    ([""], "no questions"),
    (['{"prompt": "p", "answer": 1}', '{"question": "q", "answer": "#### 1"}'],
     "line 2: needs a non-empty string 'prompt'"),
])
def test_bad_dataset_lines(lines: list[str], message: str) -> None:
    with pytest.raises(AccuracyError, match=message):
        parse_dataset_lines(lines, "f.jsonl", gsm8k_answer)


def test_select_indices() -> None:
    assert select_indices(5, None, random.Random(0)) == [0, 1, 2, 3, 4]
    assert select_indices(5, 9, random.Random(0)) == [0, 1, 2, 3, 4]
    a = select_indices(1319, 500, random.Random(7))
    assert a == select_indices(1319, 500, random.Random(7)) and a == sorted(set(a))
    assert len(a) == 500 and a != select_indices(1319, 500, random.Random(8))
    with pytest.raises(AccuracyError):
        select_indices(5, 0, random.Random(0))
    assert math.isclose(len(select_indices(10, 3, random.Random(1))), 3)
