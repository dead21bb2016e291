-- The role the portal's web, workers and beat connect as (docs/audit.md). It neither owns the
-- tables (the migrating role does) nor is a superuser, so it cannot ALTER TABLE ... DISABLE
-- TRIGGER, SET session_replication_role or drop the audit log's triggers; it is granted no
-- TRUNCATE. psql variables: app_role, app_password, owner_role, database.
CREATE ROLE :"app_role" LOGIN PASSWORD :'app_password'
    NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS;
GRANT CONNECT ON DATABASE :"database" TO :"app_role";
GRANT USAGE ON SCHEMA public TO :"app_role";
-- Tables and sequences the owner creates (every migration) are the app role's to use, not own.
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO :"app_role";
ALTER DEFAULT PRIVILEGES FOR ROLE :"owner_role" IN SCHEMA public
    GRANT USAGE, SELECT ON SEQUENCES TO :"app_role";
-- Tables that exist already (a site adding the role to an existing database).
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO :"app_role";
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA public TO :"app_role";
