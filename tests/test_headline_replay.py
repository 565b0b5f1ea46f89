"""The replayed prompts of the 4x headline are drawn from the old lines only (those that name no commit of their own),
so appending lines with their provenance leaves the draw, and the replay section on the pages, as it was made."""

from conftest import load_script


def firsts(ids: dict[str, bool], recorded: int = 0) -> dict[str, dict]:
    """A ``first_commits`` answer: the old lines of ``ids`` (id -> after the merge), then ``recorded`` multikey lines
    that carry their own provenance (logged after the merge)."""
    out = {i: {"commit": "c", "date": "d", "after_merge": after, "recorded": False} for i, after in ids.items()}
    new = {f"test/k3/32768/{100 + n}": {"commit": "n", "date": "d", "after_merge": True, "recorded": True}
           for n in range(recorded)}  # fmt: skip
    return out | new


OLD = {f"test/k1/32768/{n}": False for n in range(30)}
OLD |= {f"test/k3/32768/{n}": n >= 4 for n in range(8)}


def chosen(monkeypatch, recorded: int) -> list[str]:
    replay = load_script("headline_replay")
    monkeypatch.setattr(replay, "first_commits", lambda log: firsts(OLD, recorded))
    return replay.chosen_ids()


def test_lines_with_their_own_commit_are_never_drawn_and_leave_the_draw_as_made(monkeypatch):
    before = chosen(monkeypatch, recorded=0)
    after = chosen(monkeypatch, recorded=16)
    assert after == before
    assert all(i in OLD for i in after)
    assert [OLD[i] for i in after if "/k3/" in i] == [False, False, True]  # 2 before the merge, 1 after
