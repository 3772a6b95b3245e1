"""TokenSpeed's own overlap loop (its event loop, forward thread, device handle and model
executor) driven under the recorder; ``stand_ins`` holds everything standing in for
TokenSpeed's code (docs/tokenspeed.md)."""
