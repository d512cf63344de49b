"""The choice a launch makes on a miss, from measured build times: wait for a helper or build in place."""
from jit_ahead.core.building.build_cost import BuildCost, HelperLoad


def test_with_no_measurement_a_free_helper_is_waited_for_and_no_helper_means_building_here():
    cost = BuildCost()
    assert cost.expected_helper_wait(HelperLoad(2, True, [], 0)) is None
    assert not cost.prefer_in_place(HelperLoad(1, True, [], 0), crashed_before=False)
    assert cost.prefer_in_place(HelperLoad(0, True, [], 0), crashed_before=False)  # a helper is starting
    assert cost.prefer_in_place(HelperLoad(0, False, [], 0), crashed_before=False)  # none will come


def test_the_wait_counts_the_rounds_queued_ahead_and_the_soonest_free_helper():
    cost = BuildCost()
    cost.helper_build(4.0)
    assert cost.expected_helper_wait(HelperLoad(2, True, [1.0], 0)) == 4.0  # one helper is free now
    # both busy, one 3 s into a 4 s build: free in 1 s; 4 queued ahead over 2 helpers: 2 more rounds
    assert cost.expected_helper_wait(HelperLoad(2, True, [3.0, 0.5], 4)) == 1.0 + 2 * 4.0 + 4.0
    # a build running longer than the mean is taken as finishing now, not as a negative wait
    assert cost.expected_helper_wait(HelperLoad(1, True, [9.0], 0)) == 4.0


def test_building_here_wins_when_the_executor_builds_faster_than_the_helpers_would_deliver():
    cost = BuildCost()
    cost.helper_build(2.0)
    load = HelperLoad(1, True, [0.0], 3)  # busy for 2 s more, then 3 ahead: 2 + 3 * 2 + 2 = 10 s
    assert not cost.prefer_in_place(load, crashed_before=False)  # no in-place measurement: same as helpers
    cost.local_build(5.0)
    assert cost.prefer_in_place(load, crashed_before=False)
    cost.local_build(60.0)  # the mean moves towards slow in-place builds
    cost.local_build(60.0)
    assert not cost.prefer_in_place(load, crashed_before=False)
    assert cost.prefer_in_place(load, crashed_before=True)  # it crashed a helper: never sent to one again
