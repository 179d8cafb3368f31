"""``python -m bench tokenize`` with small prompts: the event-loop stall of counting one, four ways
for each tokeniser, and abusive prompts through a gateway in this process."""

from pathlib import Path

from bench.tokenize import main


def test_the_stall_and_the_abuse_tables_are_printed(tmp_path: Path) -> None:
    sizes = ["--size-mb", "0.05", "--repeat", "1", "--abuse-mb", "0.05", "--loop", "asyncio"]
    assert main([*sizes, "--out", str(tmp_path)]) == 0
    printed = (tmp_path / "output.txt").read_text().splitlines()
    modes = ("baseline (no counting)", "on the event loop", "asyncio.to_thread", "run_in_executor")
    assert sum(line.startswith(modes) for line in printed) == 2 * len(modes)
    abuse = printed[next(i for i, line in enumerate(printed) if line.startswith("abuse: ")) + 2 :]
    assert [line[:24].strip() for line in abuse] == ["4 over the context"] * 2 + ["6 give up after 0.5 s"] * 2
    assert all(" x " in line for line in abuse)
