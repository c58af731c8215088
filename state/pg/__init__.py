"""The PostgreSQL store (`state.backend: postgres`): the same `state.Store` as SessionDB,
for several processes sharing one database. Needs the optional extra
`switchboard[postgres]` (psycopg 3); nothing outside this package imports psycopg."""
