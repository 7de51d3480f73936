"""A small, domain-free Kubernetes toolkit on asyncio, in the manner of client-go: one API-server
client (:mod:`.client`: requests and watches over aiohttp, auth from the ``kubernetes`` client's
configuration), a list/watch loop (:mod:`.informer`), a rate-limited work queue (:mod:`.queue`) and
Lease leader election (:mod:`.lease`). It imports nothing else of agentrun (``.importlinter``)."""
