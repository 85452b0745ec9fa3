"""The live harness: client, drivers, sweeps, telemetry."""
