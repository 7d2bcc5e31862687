#!/bin/sh
# The postgres image's entrypoint (cluster/images/postgres.json), run as the postgres user. On the first
# start, an empty $PGDATA gets a cluster whose superuser $POSTGRES_USER, with the password
# $POSTGRES_PASSWORD, owns the database $POSTGRES_DB and may connect from the pod network; then postgres
# replaces this shell, so the container's signals reach it. Arguments go to postgres (e.g. -c name=value).
set -eu

PGDATA=${PGDATA:-/var/lib/postgresql/data}
POSTGRES_USER=${POSTGRES_USER:-airflow}
POSTGRES_DB=${POSTGRES_DB:-airflow}
# The local cluster's pod network (scripts/volcano_cluster.py's POD_SUBNET lies inside).
POSTGRES_CLIENT_CIDR=${POSTGRES_CLIENT_CIDR:-10.234.0.0/16}
# A mount point this user does not own (a Kubernetes volume) cannot be the data directory: postgres wants
# its own, mode 0700. The cluster goes into a directory of its own inside, as the official image advises.
if [ -d "$PGDATA" ] && [ "$(stat -c %u "$PGDATA")" != "$(id -u)" ]; then
    PGDATA=$PGDATA/pgdata
fi
export PGDATA

# An SQL identifier, its double quotes doubled.
quote_identifier() {
    printf '"%s"' "$(printf '%s' "$1" | sed 's/"/""/g')"
}

if [ -z "$(ls -A "$PGDATA" 2>/dev/null)" ]; then
    if [ -z "${POSTGRES_PASSWORD:-}" ]; then
        echo "postgres-entrypoint: $PGDATA is empty and POSTGRES_PASSWORD is unset: no cluster without a password" >&2
        exit 1
    fi
    mkdir -p "$PGDATA"
    chmod 700 "$PGDATA"
    # Readable by this user only; printf is the shell's own, so the password is in no process's arguments.
    password_file=$(mktemp)
    trap 'rm -f "$password_file"' EXIT
    printf '%s\n' "$POSTGRES_PASSWORD" >"$password_file"
    initdb --username="$POSTGRES_USER" --pwfile="$password_file" --auth=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8
    rm -f "$password_file"
    trap - EXIT
    printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    printf 'host all all %s scram-sha-256\n' "$POSTGRES_CLIENT_CIDR" >>"$PGDATA/pg_hba.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        # Single-user mode: the database is there before any client can connect. It exits 0 whatever
        # the statement did, so its output tells.
        output=$(printf 'CREATE DATABASE %s OWNER %s;\n' "$(quote_identifier "$POSTGRES_DB")" \
            "$(quote_identifier "$POSTGRES_USER")" | postgres --single -D "$PGDATA" postgres 2>&1)
        case $output in
        *ERROR:* | *FATAL:*)
            printf '%s\n' "$output" >&2
            exit 1
            ;;
        esac
    fi
fi
exec postgres -D "$PGDATA" "$@"
