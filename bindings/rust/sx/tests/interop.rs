//! Hugging Face checkpoints and PEFT adapters through the safe wrappers: a group's params
//! exported under a name map and imported into another group come back equal; a file
//! lacking params is refused naming them and the report says which; a PEFT adapter holds
//! its config.
mod common;

use sx::{HfExportOptions, HfImportOptions, Optimizer, Param, ParamGroup, PeftConfig, ShardGroup};

fn group(tag: &str) -> ShardGroup {
    let mut g = ShardGroup::new(&common::config(&common::rendezvous(tag), 0, 1)).unwrap();
    g.add_param_group(&ParamGroup::new(Optimizer::AdamW)).unwrap();
    g.add_param(&Param::new("w", &[5, 3])).unwrap();
    g.add_param(&Param::new("b", &[7])).unwrap();
    g.finalize().unwrap();
    g
}

#[test]
fn export_import_and_peft() {
    let dir = common::TempDir::new("hf");
    let mut a = group("hf-a");
    for (i, v) in a.param_mut(0).unwrap().iter_mut().enumerate() {
        *v = i as f32 * 0.25 - 1.0;
    }
    let names = vec![("w".to_string(), "model.w".to_string()), ("b".to_string(), "model.b".to_string())];
    let out = dir.join("hf");
    a.export_hf(&out, &HfExportOptions { names: names.clone(), ..Default::default() }).unwrap();
    let mut b = group("hf-b");
    let (report, result) = b.import_hf(&out, &HfImportOptions { names: names.clone(), ..Default::default() });
    result.unwrap();
    assert_eq!(report.loaded, 2);
    assert_eq!(b.param(0).unwrap(), a.param(0).unwrap());
    // A file with "w" alone: "b" is missing, named.
    let partial = dir.join("partial");
    a.export_hf(&partial, &HfExportOptions { names: names[..1].to_vec(), only_named: true, ..Default::default() })
        .unwrap();
    let (report, result) = b.import_hf(&partial, &HfImportOptions { names: names.clone(), ..Default::default() });
    let e = result.unwrap_err();
    assert_eq!(e.status(), sx::status::SX_ERR_NOT_FOUND);
    assert!(e.message().contains("\"b\" (key \"model.b\")"), "{}", e.message());
    assert_eq!(report.missing, vec![("b".to_string(), "model.b".to_string())]);
    let adapter = dir.join("adapter");
    let config = PeftConfig { target_modules: vec!["q_proj".into()], r: 4, lora_alpha: 8.0, ..Default::default() };
    a.export_peft(&adapter, &HfExportOptions { names: names[..1].to_vec(), ..Default::default() }, &config)
        .unwrap();
    let text = std::fs::read_to_string(format!("{}/adapter_config.json", adapter)).unwrap();
    assert!(text.contains("\"r\":4") && text.contains("\"target_modules\":[\"q_proj\"]"), "{}", text);
}
