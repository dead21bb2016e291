#!/bin/sh
# Run once by the postgres image when its volume is new (/docker-entrypoint-initdb.d/): the
# portal's non-owner role, from app-role.sql. docker-compose.yml mounts both files.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v app_role=portal_app -v app_password="$PORTAL_APP_DB_PASSWORD" \
    -v owner_role="$POSTGRES_USER" -v database="$POSTGRES_DB" \
    -f /docker-entrypoint-initdb.d/app-role.sql.in
