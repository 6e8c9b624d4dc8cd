//! Imports a machine from an hwloc v2 XML export (`lstopo --of xml`), so a user
//! can plan for a machine they are not on: a GPU server, a cluster node type.
//! Only the parts placement needs are read; unknown elements are skipped.

use super::{Core, Distances, Group, NumaNode, PciDevice, Topology, TopologyError};
use crate::cpuset::CpuSet;

type Node<'a, 'i> = roxmltree::Node<'a, 'i>;

fn cpuset_attr(n: &Node, name: &str) -> Result<Option<CpuSet>, String> {
    match n.attribute(name) {
        None => Ok(None),
        Some(text) => CpuSet::parse_mask(text)
            .map(Some)
            .map_err(|e| e.to_string()),
    }
}

fn num_attr<T: std::str::FromStr>(n: &Node, name: &str) -> Option<T> {
    n.attribute(name)?.trim().parse().ok()
}

/// The first ancestor (or self) that has a cpuset: where an I/O object is local.
fn locality<'a, 'i>(n: Node<'a, 'i>) -> Option<Node<'a, 'i>> {
    n.ancestors()
        .find(|a| a.has_tag_name("object") && a.attribute("cpuset").is_some())
}

fn kind(n: &Node) -> String {
    n.attribute("type").unwrap_or("").to_string()
}

/// Distinct CPU sets of the objects of one type, within the online CPUs.
fn groups(objects: &[Node], ty: &str, online: &CpuSet) -> Result<Vec<Group>, String> {
    let mut out: Vec<Group> = vec![];
    for n in objects.iter().filter(|n| kind(n) == ty) {
        let Some(cpus) = cpuset_attr(n, "cpuset")? else {
            continue;
        };
        let cpus = cpus.intersection(online);
        if !cpus.is_empty() && !out.iter().any(|g| g.cpus == cpus) {
            out.push(Group {
                id: out.len(),
                cpus,
            });
        }
    }
    Ok(out)
}

/// Packages, dies, caches and cores.
fn cpu_objects(t: &mut Topology, objects: &[Node]) -> Result<(), String> {
    let online = t.online_cpus.clone();
    t.packages = groups(objects, "Package", &online)?;
    t.dies = groups(objects, "Die", &online)?;
    t.l2_groups = groups(objects, "L2Cache", &online)?;
    t.l3_groups = groups(objects, "L3Cache", &online)?;
    t.cores = groups(objects, "Core", &online)?
        .into_iter()
        .map(|g| Core {
            id: g.id,
            package: t
                .packages
                .iter()
                .position(|p| p.cpus.intersects(&g.cpus))
                .unwrap_or(0),
            cpus: g.cpus,
            kind: None,
            capacity: None,
        })
        .collect();
    Ok(())
}

/// Elements, text and attributes of one export: an 8192-CPU machine with every
/// cache level is well under a million.
const MAX_XML_NODES: u32 = 4_000_000;
/// Element nesting: hwloc's trees are about 10-20 deep.
const MAX_XML_DEPTH: usize = 256;

/// Refuse what no hwloc export holds but hostile XML uses: entity
/// declarations (expansion bombs) and deep nesting (stack exhaustion).
fn check_shape(text: &str) -> Result<(), String> {
    if text.contains("<!ENTITY") {
        return Err("entity declarations are not part of an hwloc export".into());
    }
    let (mut depth, mut max) = (0usize, 0usize);
    let b = text.as_bytes();
    let mut i = 0;
    while let Some(off) = b[i..].iter().position(|c| *c == b'<') {
        i += off + 1;
        match b.get(i) {
            Some(b'/') => depth = depth.saturating_sub(1),
            Some(c) if c.is_ascii_alphabetic() => {
                // Find the tag's end; a self-closing tag does not nest.
                let end = b[i..]
                    .iter()
                    .position(|c| *c == b'>')
                    .map_or(b.len(), |e| i + e);
                if b[end.saturating_sub(1)] != b'/' {
                    depth += 1;
                    max = max.max(depth);
                }
                i = end;
            }
            _ => {}
        }
        if max > MAX_XML_DEPTH {
            return Err(format!("elements nested more than {MAX_XML_DEPTH} deep"));
        }
    }
    Ok(())
}

/// Parse hwloc XML text. `name` is used in messages and the `source` field.
pub(crate) fn parse(text: &str, name: &str) -> Result<Topology, TopologyError> {
    let err = |why: String| TopologyError::Xml {
        path: name.to_string(),
        why,
    };
    check_shape(text).map_err(&err)?;
    // hwloc's exports name their DTD, so DTDs are allowed; entity
    // declarations (never in an export) were refused by check_shape.
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        nodes_limit: MAX_XML_NODES,
    };
    let doc =
        roxmltree::Document::parse_with_options(text, opts).map_err(|e| err(e.to_string()))?;
    let root = doc.root_element();
    if !root.has_tag_name("topology") {
        return Err(err(format!(
            "the root element is <{}>, not <topology>",
            root.tag_name().name()
        )));
    }
    let mut t = Topology::empty(format!("hwloc-xml:{name}"));
    let objects: Vec<Node> = root
        .descendants()
        .filter(|n| n.has_tag_name("object"))
        .collect();
    t.online_cpus = objects
        .iter()
        .filter(|n| kind(n) == "PU")
        .filter_map(|n| num_attr::<usize>(n, "os_index"))
        .filter(|i| *i <= crate::cpuset::MAX_CPU)
        .collect();
    if t.online_cpus.is_empty() {
        return Err(err("no PU objects".to_string()));
    }
    let online = t.online_cpus.clone();
    cpu_objects(&mut t, &objects).map_err(&err)?;
    for n in &objects {
        match kind(n).as_str() {
            "Machine" => {
                if let Some(a) = cpuset_attr(n, "allowed_cpuset").map_err(&err)? {
                    t.limits.cgroup_cpuset = Some(a);
                    t.limits.cgroup_version = Some(super::CgroupVersion::Xml);
                }
            }
            "NUMANode" => {
                let Some(id) = num_attr::<usize>(n, "os_index") else {
                    continue;
                };
                let cpus = cpuset_attr(n, "cpuset")
                    .map_err(&err)?
                    .unwrap_or_default()
                    .intersection(&online);
                t.numa_nodes.push(NumaNode {
                    id,
                    cpus,
                    memory_bytes: num_attr(n, "local_memory").unwrap_or(0),
                });
            }
            "PCIDev" => pci_device(n, &mut t, &online)?,
            _ => {}
        }
    }
    if t.numa_nodes.is_empty() {
        t.numa_nodes.push(NumaNode {
            id: 0,
            cpus: online.clone(),
            memory_bytes: 0,
        });
    }
    t.numa_distances = distances(&root, &err)?;
    t.finish();
    Ok(t)
}

fn pci_device(n: &Node, t: &mut Topology, online: &CpuSet) -> Result<(), TopologyError> {
    let (Some(bus_id), Some(ty)) = (n.attribute("pci_busid"), n.attribute("pci_type")) else {
        return Ok(());
    };
    // pci_type: "0302 [10de:15f9] [10de:116b] a1"
    let mut parts = ty.split_whitespace();
    let class = parts
        .next()
        .and_then(|c| u32::from_str_radix(c, 16).ok())
        .unwrap_or(0);
    let ids = parts
        .next()
        .unwrap_or("")
        .trim_matches(|c| c == '[' || c == ']');
    let (vendor, device) = ids.split_once(':').unwrap_or(("", ""));
    let vendor_num = u32::from_str_radix(vendor, 16).unwrap_or(0);
    // hwloc writes class and subclass (0302); sysfs adds the prog-if byte.
    let Some(kind) = super::classify_pci(vendor_num, class << 8) else {
        return Ok(());
    };
    let place = locality(*n);
    let local_cpus = place
        .and_then(|p| cpuset_attr(&p, "cpuset").ok().flatten())
        .unwrap_or_default()
        .intersection(online);
    let numa_node = place
        .and_then(|p| CpuSet::parse_mask(p.attribute("nodeset")?).ok())
        .filter(|s| s.len() == 1)
        .and_then(|s| s.first());
    let dev = PciDevice {
        index: 0,
        bus_id: bus_id.to_string(),
        vendor: format!("0x{vendor}"),
        device: format!("0x{device}"),
        class: format!("0x{:06x}", class << 8),
        numa_node,
        local_cpus,
        ..Default::default()
    };
    match kind {
        super::PciKind::Gpu => t.gpus.push(dev),
        super::PciKind::Nic => t.nics.push(dev),
    }
    Ok(())
}

/// The NUMA latency matrix (`distances2`, type NUMANode, os indexing).
fn distances(
    root: &Node,
    err: &dyn Fn(String) -> TopologyError,
) -> Result<Option<Distances>, TopologyError> {
    let mut candidates: Vec<Node> = root
        .descendants()
        .filter(|n| {
            n.has_tag_name("distances2")
                && n.attribute("type") == Some("NUMANode")
                && n.attribute("indexing") != Some("gp")
        })
        .collect();
    // Prefer the latency matrix when several are exported.
    candidates.sort_by_key(|n| n.attribute("name") != Some("NUMALatency"));
    let Some(d) = candidates.first() else {
        return Ok(None);
    };
    let nb: usize = num_attr(d, "nbobjs").ok_or_else(|| err("distances2 without nbobjs".into()))?;
    let texts = |tag: &str| -> Vec<String> {
        d.children()
            .filter(|c| c.has_tag_name(tag))
            .filter_map(|c| c.text().map(str::to_string))
            .collect()
    };
    let ids: Vec<usize> = texts("indexes")
        .iter()
        .flat_map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|x| x.parse().ok())
        .collect();
    let values: Vec<u64> = texts("u64values")
        .iter()
        .flat_map(|s| s.split_whitespace().map(str::to_string).collect::<Vec<_>>())
        .filter_map(|x| x.parse().ok())
        .collect();
    if nb == 0 || nb > 4096 || ids.len() != nb || values.len() != nb * nb {
        return Err(err(format!(
            "distances2 has {} indexes and {} values for {nb} objects",
            ids.len(),
            values.len()
        )));
    }
    Ok(Some(Distances {
        ids,
        matrix: values.chunks(nb).map(<[u64]>::to_vec).collect(),
    }))
}

/// Read an XML file.
pub(crate) fn load(path: &std::path::Path) -> Result<Topology, TopologyError> {
    use super::fsread::{MAX_XML_FILE, ReadError, read_bounded};
    let shown = path.display().to_string();
    let text = read_bounded(path, MAX_XML_FILE).map_err(|e| match e {
        ReadError::Io(source) => TopologyError::Io {
            path: shown.clone(),
            source,
        },
        why => TopologyError::Xml {
            path: shown.clone(),
            why: format!("cannot read it: {why}"),
        },
    })?;
    parse(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SMALL: &str = r#"<?xml version="1.0"?>
<topology version="2.0">
 <object type="Machine" cpuset="0xf" allowed_cpuset="0x7">
  <object type="Package" cpuset="0xf" nodeset="0x1">
   <object type="NUMANode" os_index="0" cpuset="0xf" nodeset="0x1" local_memory="1024"/>
   <object type="Core" cpuset="0x3"><object type="PU" os_index="0" cpuset="0x1"/><object type="PU" os_index="1" cpuset="0x2"/></object>
   <object type="Core" cpuset="0xc"><object type="PU" os_index="2" cpuset="0x4"/><object type="PU" os_index="3" cpuset="0x8"/></object>
   <object type="Bridge"><object type="PCIDev" pci_busid="0000:01:00.0" pci_type="0302 [10de:20b0] [10de:1450] a1"/></object>
  </object>
 </object>
</topology>"#;

    #[test]
    fn reads_a_small_export() {
        let t = parse(SMALL, "small").unwrap();
        assert_eq!(t.online_cpus.to_string(), "0-3");
        assert_eq!(t.allowed_cpus.to_string(), "0-2");
        assert_eq!(t.cores.len(), 2);
        assert_eq!(t.gpus.len(), 1);
        assert_eq!(t.gpus[0].vendor, "0x10de");
        assert_eq!(t.gpus[0].numa_node, Some(0));
        assert_eq!(t.gpus[0].local_cpus.to_string(), "0-3");
        assert_eq!(t.numa_nodes[0].memory_bytes, 1024);
    }

    #[test]
    fn hostile_shapes_are_refused_quickly() {
        let deep = format!(
            "<topology>{}{}</topology>",
            "<object type=\"Group\">".repeat(20_000),
            "</object>".repeat(20_000)
        );
        assert!(
            parse(&deep, "x")
                .unwrap_err()
                .to_string()
                .contains("nested more than")
        );
        let bomb = format!(
            "<?xml version=\"1.0\"?><!DOCTYPE t [<!ENTITY e \"{}\">]><topology>{}</topology>",
            "x".repeat(1000),
            "&e;".repeat(5000)
        );
        assert!(
            parse(&bomb, "x")
                .unwrap_err()
                .to_string()
                .contains("entity declarations")
        );
    }

    #[test]
    fn rejects_what_is_not_hwloc() {
        assert!(parse("<html/>", "x").is_err());
        assert!(parse("not xml", "x").is_err());
        assert!(parse("<topology/>", "x").is_err());
    }

    proptest! {
        #[test]
        fn never_panics_on_random_text(s in "\\PC*") {
            let _ = parse(&s, "fuzz");
        }

        #[test]
        fn never_panics_on_mangled_exports(cut in 0usize..1500, junk in "[<>\"=/a-z0-9 ,x]{0,20}") {
            let mut s = SMALL.to_string();
            let at = cut.min(s.len());
            let at = (0..=at).rev().find(|i| s.is_char_boundary(*i)).unwrap_or(0);
            s.insert_str(at, &junk);
            let _ = parse(&s, "fuzz");
            let _ = parse(&s[..at], "fuzz");
        }
    }
}
