module github.com/sx-runtime/sx/samples/go-finetune

go 1.19

require github.com/sx-runtime/sx/bindings/go v0.0.0

replace github.com/sx-runtime/sx/bindings/go => ../../bindings/go
