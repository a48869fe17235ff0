//! CSI migration of the seven in-tree plugins (pure): which CSI driver stands for which in-tree
//! plugin, and the translations upstream's sidecar applies with csi-translation-lib, which is the
//! reference for behaviour and texts (our own code): an in-tree StorageClass to CSI before
//! `CreateVolume`, the CSI PV written back in in-tree form, and an in-tree PV to CSI before
//! `DeleteVolume`. Nothing here reads a clock or calls an API.
//!
//! Where upstream's Go iterates a map (class parameters whose keys collide once lower-cased,
//! `zone` beside `zones`), its result is random; here parameters are visited in key order and
//! the last one wins.

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;

pub(crate) mod aws_ebs;
pub(crate) mod azure_disk;
pub(crate) mod azure_file;
pub(crate) mod cinder;
pub(crate) mod gce_pd;
mod params;
pub(crate) mod portworx;
pub(crate) mod topology;
pub(crate) mod vsphere;

/// One of the seven migrated in-tree plugins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Plugin {
    AwsEbs,
    GcePd,
    AzureDisk,
    AzureFile,
    Cinder,
    Vsphere,
    Portworx,
}

/// Every plugin, in upstream's order.
pub(crate) const PLUGINS: [Plugin; 7] = [
    Plugin::AwsEbs,
    Plugin::GcePd,
    Plugin::AzureDisk,
    Plugin::AzureFile,
    Plugin::Cinder,
    Plugin::Vsphere,
    Plugin::Portworx,
];

impl Plugin {
    /// The in-tree plugin name (a StorageClass's `provisioner`, a PV's `provisioned-by`).
    pub(crate) fn in_tree_name(self) -> &'static str {
        match self {
            Self::AwsEbs => "kubernetes.io/aws-ebs",
            Self::GcePd => "kubernetes.io/gce-pd",
            Self::AzureDisk => "kubernetes.io/azure-disk",
            Self::AzureFile => "kubernetes.io/azure-file",
            Self::Cinder => "kubernetes.io/cinder",
            Self::Vsphere => "kubernetes.io/vsphere-volume",
            Self::Portworx => "kubernetes.io/portworx-volume",
        }
    }

    /// The CSI driver that took the plugin over.
    pub(crate) fn csi_name(self) -> &'static str {
        match self {
            Self::AwsEbs => "ebs.csi.aws.com",
            Self::GcePd => "pd.csi.storage.gke.io",
            Self::AzureDisk => "disk.csi.azure.com",
            Self::AzureFile => "file.csi.azure.com",
            Self::Cinder => "cinder.csi.openstack.org",
            Self::Vsphere => "csi.vsphere.vmware.com",
            Self::Portworx => "pxd.portworx.com",
        }
    }

    /// The plugin a CSI driver name stands for (exact match).
    pub(crate) fn of_driver(driver: &str) -> Option<Self> {
        PLUGINS.into_iter().find(|p| p.csi_name() == driver)
    }

    /// The plugin whose in-tree source `pv` carries, if any (upstream's `IsPVMigratable`).
    pub(crate) fn of_in_tree_pv(pv: &PersistentVolume) -> Option<Self> {
        let s = pv.spec.as_ref()?;
        PLUGINS.into_iter().find(|p| match p {
            Self::AwsEbs => s.aws_elastic_block_store.is_some(),
            Self::GcePd => s.gce_persistent_disk.is_some(),
            Self::AzureDisk => s.azure_disk.is_some(),
            Self::AzureFile => s.azure_file.is_some(),
            Self::Cinder => s.cinder.is_some(),
            Self::Vsphere => s.vsphere_volume.is_some(),
            Self::Portworx => s.portworx_volume.is_some(),
        })
    }

    /// A copy of the in-tree class `sc` as the CSI driver takes it (parameters, allowed
    /// topologies; for Portworx the provisioner too).
    pub(crate) fn translate_class(self, sc: &StorageClass) -> Result<StorageClass, String> {
        match self {
            Self::AwsEbs => aws_ebs::translate_class(sc),
            Self::GcePd => gce_pd::translate_class(sc),
            Self::AzureDisk => azure_disk::translate_class(sc),
            Self::AzureFile => Ok(sc.clone()),
            Self::Cinder => cinder::translate_class(sc),
            Self::Vsphere => vsphere::translate_class(sc),
            Self::Portworx => portworx::translate_class(sc),
        }
    }

    /// The CSI PV `pv` (of this plugin's driver) written back in in-tree form.
    pub(crate) fn csi_to_in_tree(self, pv: &PersistentVolume) -> Result<PersistentVolume, String> {
        let mut pv = pv.clone();
        let csi = pv
            .spec
            .as_mut()
            .and_then(|s| s.csi.take())
            .ok_or_else(|| "pv is nil or CSI source not defined on pv".to_owned())?;
        match self {
            Self::AwsEbs => aws_ebs::to_in_tree(&mut pv, csi)?,
            Self::GcePd => gce_pd::to_in_tree(&mut pv, csi)?,
            Self::AzureDisk => azure_disk::to_in_tree(&mut pv, csi)?,
            Self::AzureFile => azure_file::to_in_tree(&mut pv, csi)?,
            Self::Cinder => cinder::to_in_tree(&mut pv, csi)?,
            Self::Vsphere => vsphere::to_in_tree(&mut pv, csi)?,
            Self::Portworx => portworx::to_in_tree(&mut pv, csi),
        }
        Ok(pv)
    }

    /// The in-tree PV `pv` (this plugin's source) as a CSI PV of the plugin's driver.
    pub(crate) fn in_tree_to_csi(self, pv: &PersistentVolume) -> Result<PersistentVolume, String> {
        let mut pv = pv.clone();
        match self {
            Self::AwsEbs => aws_ebs::to_csi(&mut pv)?,
            Self::GcePd => gce_pd::to_csi(&mut pv)?,
            Self::AzureDisk => azure_disk::to_csi(&mut pv)?,
            Self::AzureFile => azure_file::to_csi(&mut pv)?,
            Self::Cinder => cinder::to_csi(&mut pv)?,
            Self::Vsphere => vsphere::to_csi(&mut pv)?,
            Self::Portworx => portworx::to_csi(&mut pv)?,
        }
        Ok(pv)
    }
}

/// Go's `bool` field: false is omitted on the wire, so only `true` is kept.
pub(crate) fn go_bool(b: Option<bool>) -> Option<bool> {
    b.filter(|b| *b)
}

/// Go's `string` field: empty is omitted on the wire.
pub(crate) fn go_string(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// A topology translation failure while writing a PV back, in upstream's words (upstream dumps
/// the whole PV in Go syntax after `PV:`; its name is enough to find it).
pub(crate) fn topology_error(pv: &PersistentVolume, err: &str) -> String {
    format!(
        "failed to translate topology. PV:{}. Error:{err}",
        pv.metadata.name.as_deref().unwrap_or_default()
    )
}

/// For a driver that took over an in-tree plugin: `pv` as a CSI PV of the driver when it carries
/// that plugin's in-tree source (`None`: no such PV, nothing to translate).
pub(crate) fn as_csi(
    driver: &str,
    pv: &PersistentVolume,
) -> Option<Result<PersistentVolume, String>> {
    let plugin = Plugin::of_driver(driver)?;
    (Plugin::of_in_tree_pv(pv)? == plugin).then(|| plugin.in_tree_to_csi(pv))
}

/// For a driver that took over an in-tree plugin: a class of that plugin translated for the
/// driver (`None`: not such a class).
pub(crate) fn class_as_csi(
    driver: &str,
    class: &StorageClass,
) -> Option<Result<StorageClass, String>> {
    let plugin = Plugin::of_driver(driver)?;
    (class.provisioner == plugin.in_tree_name()).then(|| plugin.translate_class(class))
}

#[cfg(test)]
#[path = "migration_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "migration_props_tests.rs"]
mod props_tests;
