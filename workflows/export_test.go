package workflows

// Patches are the change IDs of every workflow.GetVersion patch in the code (patches).
var Patches = patches

// SetUnguardedPatches makes every patch take its new branch without a version marker while
// on (unguardedPatches); the returned func restores the default.
func SetUnguardedPatches(on bool) (restore func()) {
	old := unguardedPatches
	unguardedPatches = on
	return func() { unguardedPatches = old }
}
