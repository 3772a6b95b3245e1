"""Engine-neutral machinery shared by every engine adapter (no engine names here)."""
