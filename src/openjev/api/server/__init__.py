"""The server assembled: the app factory, the object graph and its lifecycle (assembly),
the routes of both formats, the batch, the playground, the error handlers and the drain.
The only part of `api/` that imports the others."""
