"""The check job's shells: `chatfleet accuracy` (accuracy of a precision choice)."""
