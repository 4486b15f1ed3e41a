package collectived

import (
	"fmt"
	"os"
)

// The names of environment_table.go, for setting's check.
var clientVariables = func() map[string]bool {
	names := make(map[string]bool, len(clientVariableNames))
	for _, name := range clientVariableNames {
		names[name] = true
	}
	return names
}()

// setting is the Go client's one reader of its environment variables: $name when set and not
// empty, else "". It panics on a name that rpc/client_environment.h does not hold
// (environment_table.go): a typo, or a variable to add to the table first.
func setting(name string) string {
	if !clientVariables[name] {
		panic(fmt.Sprintf("%s is not a client environment variable of rpc/client_environment.h", name))
	}
	return os.Getenv(name)
}
