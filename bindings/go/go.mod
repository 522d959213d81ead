module github.com/sx-runtime/sx/bindings/go

go 1.19
