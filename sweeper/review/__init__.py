"""Reviewing a finished (or running) sweep: its trials as an Optuna study whichever backend ran
them (study_view.py), the plots of the search (plots.py) and one self-contained HTML report
(report.py). Reads the sweep's records; trains nothing."""
