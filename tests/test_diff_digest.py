"""What the diff's pages make of its clauses: the home page's "What changed" digest keeps every word of the summary
but its title, and the diff charts' labels are short, distinct and never start at an index."""

from __future__ import annotations

import functools

from cbsite import archive
from cbsite.diff import rundiff as cdiff
from cbsite.diff.clauses import Clause
from cbsite.diff.summary import paragraph
from cbsite.generator import diffdata


def test_chart_labels_are_short_distinct_and_never_start_at_an_index():
    paths = ["over_arch.model.0._mlp.1._linear", "over_arch.model.0._mlp.0._linear",
             "dense_arch.model._mlp.1._linear", "inter_arch",
             "sparse_arch.embedding_bag_collection.embedding_bags.t_cat_0", "dlrm"]
    labels = diffdata.short_labels(paths)
    assert labels == ["\u2026model.0._mlp.1._linear", "\u2026_mlp.0._linear", "\u2026model._mlp.1._linear",
                      "inter_arch", "\u2026embedding_bags.t_cat_0", "dlrm"]
    assert len(set(labels)) == len(labels)


def test_change_digest_groups_the_summary_clauses_and_keeps_every_word():
    """The home page's "What changed" row (diffdata.change_digest) is made from the diff's clauses, never from its
    words: latency changes first, then the totals that moved most by |ln ratio|; the first sentence's other parts
    in their order; every other clause on a line of its own. Only the title is left out."""
    total = functools.partial(Clause, "total", status="changed")
    clauses = [
        Clause("title", model="dlrm", version="v2", base_model="dlrm", base_version="v1"),
        total(metric="param_bytes", phase="forward", base=10_400_000, head=20_800_000, amount=10_400_000),
        total(metric="flops", phase="forward", status="unchanged", base=5, head=5, amount=0),
        total(metric="peak_memory_bytes", phase="forward", base=546_000, head=988_260, amount=442_260),
        total(metric="latency_ms", phase="forward", base=0.325, head=0.481, amount=0.156, verdict="regressed"),
        total(metric="flops", phase="backward", base=12_350_000, head=37_050_000, amount=24_700_000),
        total(metric="peak_memory_bytes", phase="backward", base=0, head=1_000_000, amount=1_000_000),
        total(metric="latency_ms", phase="backward", status="noise", base=10.0, head=11.55, amount=1.55),
        Clause("where", metric="param_bytes", phase="forward", form="cancelled", amount=-32, up=2_560_000,
               down=-2_560_032, complete=False),
        Clause("where", metric="latency_ms", phase="forward", growing=True, form="largest", path="a.b", share=0.38,
               amount=0.06),
        Clause("counts", phase="forward", counts=(("increased", 27), ("unchanged", 2))),
    ]
    summary = paragraph(clauses)
    assert summary == (
        "dlrm v2 vs v1: 2.0\u00d7 parameter memory (+10.4 MB), +81% forward peak memory (+442 kB), +48% forward "
        "latency (+0.156 ms, regressed), 3.0\u00d7 backward FLOPs (+24.7 MFLOP), new backward peak memory (+1 MB), "
        "backward latency (+1.55 ms) within noise, unchanged forward FLOPs. Parameter memory: own changes cancel out "
        "(+2.56 MB up, \u22122.56 MB down, \u221232 B net; some own changes unknown); the largest part of the latency "
        "growth (38%) is in a.b. Forward components: 27 increased, 2 unchanged.")
    d = diffdata.change_digest(clauses)
    assert d["largest"] == ["+48% forward latency (+0.156 ms, regressed)", "new backward peak memory (+1 MB)",
                            "3.0\u00d7 backward FLOPs (+24.7 MFLOP)", "2.0\u00d7 parameter memory (+10.4 MB)"]
    assert d["totals"] == ("+81% forward peak memory (+442 kB), backward latency (+1.55 ms) within noise, "
                           "unchanged forward FLOPs")
    assert d["notes"] == ["Parameter memory: own changes cancel out (+2.56 MB up, \u22122.56 MB down, \u221232 B net; "
                          "some own changes unknown)", "The largest part of the latency growth (38%) is in a.b",
                          "Forward components: 27 increased, 2 unchanged"]
    assert d["regressed"] is True  # the forward latency total was judged regressed
    words = lambda t: {w.strip(",.;:()").lower() for w in t.split()} - {""}  # noqa: E731
    kept = " ".join(d["largest"] + [d["totals"]] + d["notes"])
    assert words(summary.split(": ", 1)[1]) == words(kept)
    nothing = [Clause("nothing", model="m", version="b", base_model="m", base_version="a")]
    assert diffdata.change_digest(nothing) == {"largest": [], "totals": "", "notes": [paragraph(nothing)],
                                               "regressed": False}
    noise_only = [c for c in clauses if c.metric != "latency_ms" or c.status == "noise"]
    assert diffdata.change_digest(noise_only)["regressed"] is False  # within noise is not a regression


def test_change_digest_of_a_real_diff_says_what_its_summary_says(demo_runs):
    """On the tests' archive's diffs, the digest and the summary come from the same clauses: every word of the
    summary but its title is in the digest."""
    words = lambda t: {w.strip(",.;:()").lower() for w in t.split()} - {""}  # noqa: E731
    refs = sorted(archive.list_runs(demo_runs), key=lambda r: r.run_id)
    for model in sorted({r.model for r in refs}):
        mine = [r for r in refs if r.model == model]
        if len(mine) < 2:
            continue
        rd = cdiff.diff_runs(archive.read_run(mine[0].path), archive.read_run(mine[-1].path))
        clauses = rd.clauses()
        d = diffdata.change_digest(clauses)
        assert words(rd.summary().split(": ", 1)[1]) == words(" ".join(d["largest"] + [d["totals"]] + d["notes"]))
