"""Where each service's parts are built and wired: the one place to swap a part.

``ferry.compose.gateway`` builds the gateway's parts, ``ferry.compose.batcher`` the batcher's;
neither imports the other, and neither imports the services they build for, so a batcher process
never loads the gateway's modules (nor the gateway the batcher's). Building a part opens nothing;
the service that owns the parts starts and stops them. Tests build parts with their own pieces (a
backend, a metrics registry) and hand them to the service.
"""
