"""What the two aiohttp servers (gateway, simserver) share of HTTP: the one BadRequest and the
error middleware (errors), reading a JSON body within limits (body), the OpenAI request bodies
(models), the gateway's OpenAPI description built from them (openapi), and the servers' log
lines (log)."""
