"""The engine model: step time, KV pool, radix prefix cache, scheduler, thermal model."""
