"""The task store's migration that adds outcomes (api/server/task_store.py `MIGRATIONS`, step 2).

`decisions`: one row per recorded decision of a key (its id: the response's request id, a
batch item's `<request id>:<index>`), pruned by age and by count per key; `readings`: per
question of it, what a task's fit reads (`logs`, JSON), under which binding, which fit
answered it, and the outcome once posted (`gold`, the option's index, at `answered`);
`questions` and `bindings` hold each question object and binding once; `example_readings`:
a task's labelled examples as last read by the engine, so an outcome refit needs no engine.
The state text of a decision is never stored."""

OUTCOMES_MIGRATION = """
    CREATE TABLE questions (
        owner TEXT NOT NULL,
        wording TEXT NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (owner, wording)
    );
    CREATE TABLE bindings (
        id INTEGER PRIMARY KEY,
        body TEXT NOT NULL UNIQUE
    );
    CREATE TABLE decisions (
        owner TEXT NOT NULL,
        id TEXT NOT NULL,
        created REAL NOT NULL,
        PRIMARY KEY (owner, id)
    );
    CREATE INDEX decisions_created ON decisions (created);
    CREATE INDEX decisions_owner_created ON decisions (owner, created);
    CREATE TABLE readings (
        owner TEXT NOT NULL,
        decision TEXT NOT NULL,
        n INTEGER NOT NULL,
        name TEXT NOT NULL,
        wording TEXT NOT NULL,
        binding INTEGER NOT NULL REFERENCES bindings (id),
        logs TEXT NOT NULL,
        fit TEXT,
        gold INTEGER,
        answered REAL,
        PRIMARY KEY (owner, decision, n),
        FOREIGN KEY (owner, decision) REFERENCES decisions (owner, id) ON DELETE CASCADE
    );
    CREATE INDEX readings_outcomes ON readings (owner, wording) WHERE gold IS NOT NULL;
    CREATE TABLE example_readings (
        task_id TEXT PRIMARY KEY REFERENCES tasks (id) ON DELETE CASCADE,
        generation INTEGER NOT NULL,
        binding TEXT NOT NULL,
        rows TEXT NOT NULL
    );
"""
