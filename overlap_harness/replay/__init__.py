"""The GPU replay, one package above the devices: what each run should show (``plan``), the
gates that hold racing pairs to the simulator's order (``gates``), the trials on a device
(``trials``), the suite command (``suite``), its report (``report``), the sentinel device that
writes the simulator's never-written contents (``sentinel``), the sync audit
(``sync_audit``) and the sanitizer's time limits (``limits``). It imports the simulator, the
CUDA device and ``model``; the devices never import it."""
