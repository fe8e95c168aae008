package cpustat

// Parse is parse, for tests.
var Parse = parse

// ParseMachine is parseMachine, for tests.
var ParseMachine = parseMachine

// MachineOf is machineOf, for tests.
var MachineOf = machineOf
