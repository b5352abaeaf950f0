#!/bin/bash
# Runs once, when the postgres container starts on an empty data volume (the image runs every
# *.sh in /docker-entrypoint-initdb.d). Two roles, each owning its database:
#   sweeper -> optuna (the Optuna studies and sweeper's ledger)
#   mlflow  -> mlflow (MLflow's tracking store and its basic-auth users)
# The passwords come from the environment (compose passes them from .env) as psql variables,
# quoted by psql (:'name'), so no character in them can break the SQL.
set -euo pipefail
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
     -v sweeper_password="$SWEEPER_DB_PASSWORD" -v mlflow_password="$MLFLOW_DB_PASSWORD" <<'SQL'
CREATE ROLE sweeper LOGIN PASSWORD :'sweeper_password';
CREATE ROLE mlflow LOGIN PASSWORD :'mlflow_password';
CREATE DATABASE optuna OWNER sweeper;
CREATE DATABASE mlflow OWNER mlflow;
-- only the owner connects (PostgreSQL grants CONNECT to PUBLIC by default)
REVOKE ALL ON DATABASE optuna FROM PUBLIC;
REVOKE ALL ON DATABASE mlflow FROM PUBLIC;
SQL
