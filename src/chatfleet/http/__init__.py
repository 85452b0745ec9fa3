"""What the two aiohttp servers (gateway, simserver) share of HTTP: the one BadRequest and the
error middleware (errors), reading a JSON body within limits (body), the OpenAI request bodies
(models), the gateway's OpenAPI description built from them (openapi), the servers' log
lines (log), and a server run on its own event loop in a thread, for tests, benchmarks and
parity runs (threads)."""
