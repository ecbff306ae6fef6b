import math

import pytest

from openjev.core.readouts import LettersReadout, PerTypeReadout, ReadoutSpec, YesNoReadout
from openjev.core.types import ChoiceQuestion, NoulQuestion, Option, ScoreQuestion
from openjev.errors import ConfigError

LABELS = tuple("ABCDEFGHIJ")
IDS = tuple(range(100, 110))


def choice(*names: str) -> ChoiceQuestion:
    return ChoiceQuestion("Which team?", tuple(Option(n, None) for n in names))


def letters(rotations: int) -> LettersReadout:
    return LettersReadout(LABELS, IDS, rotations=rotations)


def test_spec_normalises_and_refuses():
    assert ReadoutSpec("yesno", 4) == ReadoutSpec("yesno")
    assert ReadoutSpec("letters", 4).describe() == "letters;rotations=4"
    with pytest.raises(ConfigError):
        ReadoutSpec("words")
    with pytest.raises(ConfigError):
        ReadoutSpec("letters", 0)


def test_a_per_type_spec_names_other_readouts_for_some_types_and_compares_by_meaning():
    spec = ReadoutSpec("letters", 1, (("noul", ReadoutSpec("yesno")), ("choice", ReadoutSpec("yesno", 3))))
    assert spec.per_type == (("choice", ReadoutSpec("yesno")), ("noul", ReadoutSpec("yesno")))  # sorted
    assert spec.describe() == "letters;choice=yesno;noul=yesno"
    assert spec.for_type("choice") == ReadoutSpec("yesno") and spec.for_type("score") == ReadoutSpec("letters")
    assert spec.parts() == [ReadoutSpec("letters"), ReadoutSpec("yesno"), ReadoutSpec("yesno")]
    # a type read like the rest is no exception: the spec is the plain one
    assert ReadoutSpec("letters", 4, (("score", ReadoutSpec("letters", 4)),)) == ReadoutSpec("letters", 4)
    assert ReadoutSpec("letters", 1, (("score", ReadoutSpec("letters", 2)),)).describe() == "letters;score=letters:2"
    with pytest.raises(ConfigError, match="question type"):
        ReadoutSpec("letters", 1, (("ranking", ReadoutSpec("yesno")),))
    with pytest.raises(ConfigError, match="twice"):
        ReadoutSpec("letters", 1, (("noul", ReadoutSpec("yesno")), ("noul", ReadoutSpec("parallel"))))
    with pytest.raises(ConfigError, match="cannot itself"):
        ReadoutSpec("letters", 1, (("noul", spec),))


def test_a_per_type_readout_reads_and_combines_each_question_with_its_types_readout():
    yesno = YesNoReadout(1, 2)
    spec = ReadoutSpec("letters", 2, (("choice", ReadoutSpec("yesno")),))
    readout = PerTypeReadout(spec, letters(2), {"choice": yesno})
    team, refund = choice("a", "b", "c"), NoulQuestion("Refund?")
    assert readout.count(team) == 3 and readout.readings(team) == yesno.readings(team)  # one per option
    assert readout.count(refund) == 2 and readout.readings(refund) == letters(2).readings(refund)
    lps = [[math.log(0.8), math.log(0.2)], [math.log(0.5), math.log(0.5)], [math.log(0.2), math.log(0.8)]]
    assert readout.combine(team, lps) == yesno.combine(team, lps)
    noul = [[math.log(0.9), math.log(0.1)], [math.log(0.3), math.log(0.7)]]
    assert readout.combine(refund, noul) == letters(2).combine(refund, noul)


@pytest.mark.parametrize(
    ("rotations", "shifts"), [(1, [0]), (2, [0, 2]), (3, [0, 1, 2]), (4, [0, 1, 2, 3]), (9, [0, 1, 2, 3])]
)
def test_rotations_are_evenly_spaced_cyclic_shifts_capped_at_the_option_count(rotations, shifts):
    orders = letters(rotations).orders(choice("a", "b", "c", "d"))
    assert [o[0] for o in orders] == shifts
    for order in orders:
        assert sorted(order) == [0, 1, 2, 3]
        assert all(order[(j + 1) % 4] == (order[j] + 1) % 4 for j in range(4))  # cyclic


def test_a_scale_is_read_ascending_and_reversed_never_rotated():
    q = ScoreQuestion("How urgent?", ("low", "mid", "high"))
    assert letters(1).orders(q) == [(0, 1, 2)]
    assert letters(4).orders(q) == [(0, 1, 2), (2, 1, 0)]
    texts = [r.text for r in letters(2).readings(q)]
    assert "from lowest to highest" in texts[0] and "A. low" in texts[0]
    assert "from highest to lowest" in texts[1] and "A. high" in texts[1]


def test_readings_show_the_rotated_options_under_the_same_letters():
    readings = letters(2).readings(choice("billing", "tech", "sales", "legal"))
    assert "A. billing" in readings[0].text and "A. sales" in readings[1].text and "D. tech" in readings[1].text
    assert all(r.label_ids == IDS[:4] for r in readings)


def _biased_model(readout: LettersReadout, question, prefer: str, bias_a: float):
    """Log-probs of a fake model that likes one option and, more, the letter A."""
    out = []
    for order in readout.orders(question):
        names = [question.options[i].name for i in order]
        logits = [(1.0 if n == prefer else 0.0) + (bias_a if j == 0 else 0.0) for j, n in enumerate(names)]
        z = math.log(sum(math.exp(x) for x in logits))
        out.append(tuple(x - z for x in logits))
    return out


def test_rotations_cancel_a_letter_bias_and_report_agreement():
    q = choice("billing", "tech", "sales", "legal")
    plain, rotated = letters(1), letters(4)
    one = plain.combine(q, _biased_model(plain, q, prefer="sales", bias_a=3.0))
    assert max(range(4), key=lambda i: one.probs[i]) == 0  # the letter bias wins: "billing"
    assert one.order_agreement is None
    four = rotated.combine(q, _biased_model(rotated, q, prefer="sales", bias_a=3.0))
    assert max(range(4), key=lambda i: four.probs[i]) == 2  # averaged over positions: "sales"
    assert math.fsum(four.probs) == pytest.approx(1.0)
    assert four.order_agreement == pytest.approx(1 / 4)  # only the reading with "sales" at A agrees


def test_full_rotations_make_the_answer_invariant_to_the_callers_order():
    q = choice("billing", "tech", "sales")
    turned = choice("tech", "sales", "billing")
    r = letters(3)
    a = dict(zip([o.name for o in q.options], r.combine(q, _biased_model(r, q, "tech", 2.0)).probs, strict=True))
    b = dict(
        zip(
            [o.name for o in turned.options],
            r.combine(turned, _biased_model(r, turned, "tech", 2.0)).probs,
            strict=True,
        )
    )
    assert a == pytest.approx(b)


def test_yesno_reads_each_candidate_and_normalises_p_yes():
    r = YesNoReadout(7, 8)
    q = choice("billing", "tech", "sales")
    readings = r.readings(q)
    assert len(readings) == 3 and all(x.label_ids == (7, 8) for x in readings)
    # candidates share everything up to the candidate itself (the trie shares it)
    shared = readings[0].text[: readings[0].text.index("Proposed answer")]
    assert all(x.text.startswith(shared) for x in readings)
    assert [x.text.count(n) for x, n in zip(readings, ("billing", "tech", "sales"), strict=True)] == [1, 1, 1]
    p_yes = [0.8, 0.5, 0.2]
    lp = [(math.log(p), math.log(1 - p)) for p in p_yes]
    combined = r.combine(q, lp)
    assert combined.probs == pytest.approx([p / sum(p_yes) for p in p_yes])
    assert combined.label_mass == pytest.approx(1.0)
    assert combined.order_agreement is None


def test_yesno_noul_and_scale():
    r = YesNoReadout(7, 8)
    noul = NoulQuestion("Refund?", "asks for money back", None)
    (reading,) = r.readings(noul)
    assert "Yes means: asks for money back" in reading.text
    assert r.combine(noul, [(math.log(0.3), math.log(0.6))]).probs == pytest.approx((1 / 3, 2 / 3))
    scale = ScoreQuestion("Urgency?", ("low", "high"))
    texts = [x.text for x in r.readings(scale)]
    assert all("1. low" in t and "2. high" in t for t in texts)  # the scale is shared context
    assert "level 2 (high)" in texts[1]


def test_yesno_without_any_yes_is_unusable():
    with pytest.raises(ValueError):  # noqa: PT011 - the type is the contract here, not the message
        YesNoReadout(7, 8).combine(choice("a", "b"), [(-math.inf, -0.1), (-math.inf, -0.2)])


def test_questions_with_many_options_are_read_once():
    many = choice(*(f"o{i}" for i in range(30)))
    assert len(LettersReadout(LABELS * 3, IDS * 3, rotations=4, max_rotated_options=26).orders(many)) == 1
    assert len(LettersReadout(LABELS * 3, IDS * 3, rotations=4, max_rotated_options=30).orders(many)) == 4


def test_parallel_reads_choice_options_side_by_side_in_a_canonical_order():
    from openjev.core.readouts import ParallelReadout

    ro = ParallelReadout(LABELS, IDS)
    a = ChoiceQuestion("Which team?", (Option("x", "Zebra"), Option("y", "Apple"), Option("z", None)))
    b = ChoiceQuestion("Which team?", (a.options[2], a.options[0], a.options[1]))  # the caller's order differs
    [ra], [rb] = ro.readings(a), ro.readings(b)
    assert ra == rb  # the model is shown the same thing
    assert ra.parallel == ("\nA. Apple", "\nB. Zebra", "\nC. z")  # by the text shown ("z" sorts after "Zebra")
    assert ra.text.endswith("Options:") and ra.label_ids == IDS[:3]
    lp = [math.log(0.5), math.log(0.3), math.log(0.2)]  # A, B, C
    pa, pb = ro.combine(a, [lp]).probs, ro.combine(b, [lp]).probs
    assert pa == pytest.approx((0.3, 0.5, 0.2))  # x=Zebra=B, y=Apple=A, z=C
    assert dict(zip("xyz", pa, strict=True)) == dict(zip("zxy", pb, strict=True))
    assert ro.combine(a, [lp]).order_agreement is None


def test_parallel_reads_noul_and_scales_as_letters():
    from openjev.core.readouts import ParallelReadout

    ro = ParallelReadout(LABELS, IDS)
    for q in (NoulQuestion("Refund?"), ScoreQuestion("How urgent?", ("low", "mid", "high"))):
        assert ro.readings(q) == letters(1).readings(q)
    assert ReadoutSpec("parallel", 4) == ReadoutSpec("parallel")  # rotations mean nothing to it


def test_canonical_reads_choice_options_once_in_parallels_order_one_after_another():
    from openjev.core.readouts import ParallelReadout

    ro = LettersReadout(LABELS, IDS, canonical=True)
    assert ro.spec == ReadoutSpec("canonical") == ReadoutSpec("canonical", 4)  # one reading, whatever --rotations
    a = ChoiceQuestion("Which team?", (Option("x", "Zebra"), Option("y", "Apple"), Option("z", None)))
    b = ChoiceQuestion("Which team?", (a.options[2], a.options[0], a.options[1]))  # the caller's order differs
    [ra], [rb] = ro.readings(a), ro.readings(b)
    assert ra == rb and not ra.parallel  # the same text for any order, a plain (sequential) reading
    assert ra.text.endswith("A. Apple\nB. Zebra\nC. z") and ra.label_ids == IDS[:3]
    assert ro.orders(a) == ParallelReadout(LABELS, IDS).orders(a)  # parallel's sequential twin
    lp = [math.log(0.5), math.log(0.3), math.log(0.2)]  # A, B, C
    pa, pb = ro.combine(a, [lp]), ro.combine(b, [lp])
    assert pa.probs == pytest.approx((0.3, 0.5, 0.2))  # x=Zebra=B, y=Apple=A, z=C
    assert dict(zip("xyz", pa.probs, strict=True)) == dict(zip("zxy", pb.probs, strict=True))
    assert pa.order_agreement is None and ro.count(a) == 1


def test_canonical_reads_noul_once_and_every_scale_both_ways():
    ro = LettersReadout(LABELS, IDS, rotations=4, canonical=True)
    noul = NoulQuestion("Refund?")
    assert ro.readings(noul) == letters(1).readings(noul) and ro.count(noul) == 1
    scale = ScoreQuestion("How urgent?", ("low", "mid", "high"))
    # the scale and its reverse, as letters R=2 reads it (the same texts: no new wording)
    assert ro.readings(scale) == letters(2).readings(scale) and ro.count(scale) == 2
    assert ro.orders(scale) == [(0, 1, 2), (2, 1, 0)]
    # reversing the caller's scale mirrors the answer: the reversed question's readings show
    # the same levels at the same letters (only the heading's direction words differ), so
    # equal log-probs per displayed list give the mirrored distribution
    rev = ScoreQuestion("How urgent?", ("high", "mid", "low"))
    up, down = [math.log(0.6), math.log(0.3), math.log(0.1)], [math.log(0.2), math.log(0.3), math.log(0.5)]
    asc_text, desc_text = (r.text.split("\n")[-3:] for r in ro.readings(scale))
    rev_asc, rev_desc = (r.text.split("\n")[-3:] for r in ro.readings(rev))
    assert asc_text == rev_desc and desc_text == rev_asc
    p, q = ro.combine(scale, [up, down]).probs, ro.combine(rev, [down, up]).probs
    assert p == pytest.approx(q[::-1])
    assert ro.combine(scale, [up, down]).order_agreement is not None  # two orders read
    many = choice(*(f"o{i:02d}" for i in range(30)))
    assert ro.count(many) == 1 and ro.orders(many) == [tuple(range(30))]


def test_mirror_reads_every_question_in_the_canonical_order_and_its_reverse():
    ro = LettersReadout(LABELS, IDS, rotations=4, mirror=True)
    assert ro.spec == ReadoutSpec("mirror") == ReadoutSpec("mirror", 4)  # rotations mean nothing to it
    a = ChoiceQuestion("Which team?", (Option("x", "Zebra"), Option("y", "Apple"), Option("z", None)))
    b = ChoiceQuestion("Which team?", (a.options[2], a.options[0], a.options[1]))
    assert ro.readings(a) == ro.readings(b) and ro.count(a) == 2  # order-free: the same two texts
    assert ro.orders(a) == [(1, 0, 2), (2, 0, 1)]  # Apple, Zebra, z and its reverse
    # a model that only ever says "A" (a pure position preference) is cancelled to first order
    lp = [math.log(0.7), math.log(0.2), math.log(0.1)]
    pa = ro.combine(a, [lp, lp]).probs
    assert pa == pytest.approx((0.2, 0.4, 0.4))  # x (middle twice), y (first, then last), z (last, then first)
    assert dict(zip("xyz", pa, strict=True)) == pytest.approx(
        dict(zip("zxy", ro.combine(b, [lp, lp]).probs, strict=True))
    )
    noul = NoulQuestion("Refund?")
    assert ro.orders(noul) == [(0, 1), (1, 0)] and ro.combine(noul, [lp[:2], lp[:2]]).probs == pytest.approx((0.5, 0.5))
    scale = ScoreQuestion("How urgent?", ("low", "mid", "high"))
    assert ro.readings(scale) == letters(2).readings(scale)
    many = choice(*(f"o{i:02d}" for i in range(30)))
    assert ro.count(many) == 1 and len(ro.orders(many)) == 1  # past max_rotated_options: read once


def test_mirror_reads_a_two_option_choice_as_the_noul_with_the_same_texts():
    ro = LettersReadout(LABELS, IDS, mirror=True)
    noul = NoulQuestion("Is it paid?")
    as_choice = ChoiceQuestion("Is it paid?", (Option("yes", "Yes"), Option("no", "No")))
    assert sorted(r.text for r in ro.readings(noul)) == sorted(r.text for r in ro.readings(as_choice))
    up, down = [math.log(0.8), math.log(0.2)], [math.log(0.6), math.log(0.4)]
    p_yes = ro.combine(noul, [up, down]).probs[0]
    # the choice lists No first in its canonical order: its first reading is noul's second
    assert ro.combine(as_choice, [down, up]).probs[0] == pytest.approx(p_yes)


def test_options_shown_with_the_same_text_share_their_probability():
    for ro in (LettersReadout(LABELS, IDS, canonical=True), LettersReadout(LABELS, IDS, mirror=True)):
        q = ChoiceQuestion("Which?", (Option("a", "Same"), Option("b", "Other"), Option("c", "Same")))
        lp = [math.log(0.5), math.log(0.3), math.log(0.2)]
        probs = ro.combine(q, [lp] * ro.count(q)).probs
        assert probs[0] == pytest.approx(probs[2]) and sum(probs) == pytest.approx(1.0)
    plain = letters(1)  # the caller's order, lettered as given: no such rule
    assert plain.combine(q, [lp]).probs == pytest.approx((0.5, 0.3, 0.2))


def test_one_lettered_ordering_says_which_option_each_letter_showed():
    q = ChoiceQuestion("Which team?", (Option("x", "Zebra"), Option("y", "Apple"), Option("z", "Mango")))
    lp = [math.log(1 / 3)] * 3
    assert LettersReadout(LABELS, IDS, canonical=True).combine(q, [lp]).shown == (1, 2, 0)
    assert letters(1).combine(q, [lp]).shown == (0, 1, 2)
    assert letters(2).combine(q, [lp, lp]).shown is None  # two orderings averaged: no one letter per option
    # one ordering and its reverse (a scale both ways): the first ordering, marked mirrored
    scale = ScoreQuestion("How urgent?", ("low", "mid", "high"))
    both = LettersReadout(LABELS, IDS, canonical=True).combine(scale, [lp, lp])
    assert both.shown == (0, 1, 2) and both.mirrored
    assert not LettersReadout(LABELS, IDS, canonical=True).combine(q, [lp]).mirrored


def test_canonical_reads_a_two_option_choice_both_ways_as_a_noul_would_be_under_mirror():
    ro = LettersReadout(LABELS, IDS, canonical=True)
    q = ChoiceQuestion("Is it paid?", (Option("yes", "Yes"), Option("no", "No")))
    assert ro.orders(q) == [(1, 0), (0, 1)] and ro.count(q) == 2
    up = [math.log(0.7), math.log(0.3)]  # a model that only says "A"
    assert ro.combine(q, [up, up]).probs == pytest.approx((0.5, 0.5))
