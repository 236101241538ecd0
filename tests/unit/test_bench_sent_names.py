"""The extender benchmark's model of what kube-scheduler sends an extender's filter."""

from bench.extender_bench import kube_scheduler_feasible, names_sent


def test_feasible_nodes_follow_kube_schedulers_default_percentage() -> None:
    # 50% less one point per 125 nodes, at least 5%, never fewer than 100 nodes
    assert kube_scheduler_feasible(50) == 50
    assert kube_scheduler_feasible(150) == 100  # 49% of 150 is 73: the floor of 100
    assert kube_scheduler_feasible(1000) == 420  # 42%
    assert kube_scheduler_feasible(5000) == 500  # 10%
    assert kube_scheduler_feasible(10000) == 500  # 5%, the least share
    assert kube_scheduler_feasible(20000) == 1000


def test_names_sent_start_at_the_rotation_and_skip_nodes_without_room() -> None:
    names = [f"n{i:03d}" for i in range(200)]
    free = {n: (0 if i % 2 else 2) for i, n in enumerate(names)}  # odd nodes are full
    sent = names_sent(names, free, 2, start=150)
    assert len(sent) == 100
    assert sent[:2] == ["n150", "n152"]
    assert "n000" in sent  # wrapped past the end
    assert all(free[n] >= 2 for n in sent)
