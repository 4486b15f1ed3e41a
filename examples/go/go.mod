module github.com/collectived/collectived/examples/go

go 1.19

require github.com/collectived/collectived/clients/go v0.1.0
