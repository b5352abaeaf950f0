"""Issue #55 item 3: search.rung_model, a sampler that learns from pruned and low-fidelity trials
(optuna#1647). While fewer than 10 trials are complete, TPE is shown the trials at the highest
epoch 10 of them reached (BOHB's rule), each as complete with its value there; with 10 complete,
the trials as they are."""

from __future__ import annotations

import optuna
from optuna.distributions import FloatDistribution
from optuna.trial import TrialState, create_trial

from sweeper.search.optuna.batches import RUNG_MODEL_MIN, _at_rung

LR = FloatDistribution(1e-3, 1e-1, log=True)


def _trial(lr: float, values: list[float], state: TrialState) -> optuna.trial.FrozenTrial:
    return create_trial(
        state=state,
        value=values[-1] if state == TrialState.COMPLETE else None,
        params={"lr": lr},
        distributions={"lr": LR},
        intermediate_values={e: v for e, v in enumerate(values, start=1)},
    )


def test_pruned_trials_are_modelled_at_the_highest_rung_enough_reached():
    pruned_at_1 = [_trial(1e-3, [0.1], TrialState.PRUNED) for _ in range(5)]
    pruned_at_3 = [_trial(0.01 + k * 1e-3, [0.2, 0.3, 0.4 + k / 100], TrialState.PRUNED) for k in range(8)]
    complete = [_trial(0.05, [0.2, 0.5, 0.6, 0.7, 0.8], TrialState.COMPLETE) for _ in range(2)]
    seen = _at_rung(pruned_at_1 + pruned_at_3 + complete, epochs=5)
    # epoch 3: 10 trials reached it (8 pruned there, 2 complete); epoch 1: 15, but lower
    at_3 = seen[5:]
    assert all(t.state == TrialState.COMPLETE for t in at_3)
    assert [t.value for t in at_3] == [0.4 + k / 100 for k in range(8)] + [0.6, 0.6]
    assert all(t.state == TrialState.PRUNED for t in seen[:5])  # stopped before it: as they are
    assert [t.params for t in seen] == [t.params for t in pruned_at_1 + pruned_at_3 + complete]


def test_with_enough_complete_trials_the_sampler_sees_them_as_they_are():
    trials = [_trial(0.01, [0.1, 0.2], TrialState.COMPLETE) for _ in range(RUNG_MODEL_MIN)]
    trials += [_trial(0.02, [0.3], TrialState.PRUNED) for _ in range(RUNG_MODEL_MIN)]
    assert _at_rung(trials, epochs=2) is trials
    few = [_trial(0.02, [0.3], TrialState.PRUNED) for _ in range(RUNG_MODEL_MIN - 1)]
    assert _at_rung(few, epochs=2) is few  # no rung reached by enough: as they are


def test_a_sweep_with_rung_model_shows_its_sampler_the_rungs(workdir, monkeypatch):
    from conftest import sweeper, write_spec

    from sweeper.search.optuna import batches

    shown: list[int] = []

    def recorded(trials, epochs):
        shown.append(len(trials))
        return _at_rung(trials, epochs)

    monkeypatch.setattr(batches, "_at_rung", recorded)
    spec = write_spec(workdir / "spec.yaml", tracking={"enabled": False})
    sweeper("run", str(spec), "search.rung_model=true", "search.n_trials=8", "--out", "out", "-q", check=True)
    assert shown == [0, 4]  # each batch's proposal (of 4) saw the trials before it, through the rung model
    shown.clear()
    sweeper("run", str(spec), "search.n_trials=8", "--out", "off", "-q", check=True)
    assert shown == []
