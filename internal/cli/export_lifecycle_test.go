package cli

import "flag"

// RequireWorker is the check subscribe and scan --wait make before they wait for a workflow.
var RequireWorker = requireWorker

// SourceFlagGroups returns the flags `source update` carries over, by group.
func SourceFlagGroups() (http, stdio, neutral []string) { return httpFlags, stdioFlags, neutralFlags }

// SourceFlagNames returns the names of every flag newSourceFlags defines.
func SourceFlagNames() []string {
	fs := flag.NewFlagSet("", flag.ContinueOnError)
	newSourceFlags(fs, "")
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	return names
}
