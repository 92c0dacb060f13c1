"""A paced replay's bound: one that would take longer than MAX_PACED_S at its rate is refused before
anything is touched (the pacing itself runs on a real proxy in tests/client/test_actions_cli.py)."""

from __future__ import annotations

import pytest

from ddmq.proxy.core.errors import BadRequestError
from ddmq.proxy.servers.http.letters import MAX_PACED_S, Entry, ReplayPlan, check_pace


def test_a_paced_replay_longer_than_its_bound_is_refused() -> None:
    plan = ReplayPlan([Entry(0, n, f"0-{n}", "k") for n in range(1, MAX_PACED_S + 2)], [], {}, [])
    check_pace(plan, None)
    check_pace(plan, 2)
    with pytest.raises(BadRequestError, match=f"longer than {MAX_PACED_S} s"):
        check_pace(plan, 1)
