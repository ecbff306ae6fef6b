"""`/v1/outcomes`: decisions kept per key for a bounded time (`recorder.py` writes them off
the event loop; `store.py` keeps them in the task store's file), the true answers callers
post for them (`routes.py`), and the refits of the questions' tasks on the stored readings,
with no engine work (`refits.py`). `tenant.py`: whose decisions a request sees."""
