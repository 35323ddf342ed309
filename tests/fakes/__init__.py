"""Stand-ins for the project's parts in tests of pure logic, type-checked against the seams they stand in
for."""
