package cpustat

// Parse is parse, for tests.
var Parse = parse

// ParseMachine is parseMachine, for tests.
var ParseMachine = parseMachine
